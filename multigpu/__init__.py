"""multigpu: the engine under a Lightning project that trains the same model on one CPU, one GPU, several
GPUs (dp, ddp, ddp_spawn, fsdp2, tensor_parallel, pipeline) and SLURM clusters.

The public interface is what this module lists in ``__all__`` (docs/engine.md says what each is for); every other
module is the engine's own and may change in any release. A project calls:

- ``TemplateCLI`` and ``run_cli``: the command line (``src/cli.py`` of a project subclasses ``TemplateCLI`` with its
  ``configs/default.yaml`` and calls ``run_cli``);
- ``TemplateModule``, ``Classifier``, ``GlobalBatchDataModule``: the base classes a model and a data module may
  subclass, with the helpers they use (``WeightedMean``, ``at_least_fp32``, ``seeded_generator``, ``global_seed``,
  ``per_process_batch_size``);
- ``ConfigurationError`` and the failure helpers: one-paragraph errors a data module raises;
- ``hooks``: what a model or data module may implement for the engine, each hook with the feature that reads it;
- ``testing``: the proofs a project's tests make for its own model (a pytest plugin).

The commands: ``python -m multigpu.consolidate``, ``python -m multigpu.stacks`` and
``python -m multigpu.sweep``.
"""

from __future__ import annotations

import importlib
from typing import Any

#: semantic versioning (CHANGELOG.md): a major release may change the public interface, a minor one adds to it
__version__ = "1.1.0"

#: public name -> the module that defines it, imported when first used (``import multigpu`` stays cheap)
_PUBLIC = {
    "TemplateCLI": "multigpu.cli",
    "run_cli": "multigpu.cli",
    "TemplateModule": "multigpu.models.base",
    "Classifier": "multigpu.models.base",
    "WeightedMean": "multigpu.models.base",
    "at_least_fp32": "multigpu.models.base",
    "GlobalBatchDataModule": "multigpu.data.base",
    "seeded_generator": "multigpu.data.base",
    "global_seed": "multigpu.data.sampling",
    "per_process_batch_size": "multigpu.data.sampling",
    "ConfigurationError": "multigpu.errors",
    "EnvironmentFailure": "multigpu.errors",
    "FILE_SYSTEM_ERRNOS": "multigpu.failures",
    "file_system_failure": "multigpu.failures",
    "network_failure": "multigpu.failures",
    "is_network_error": "multigpu.failures",
}
_MODULES = ("hooks", "testing")

__all__ = ["__version__", *_PUBLIC, *_MODULES]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups do not come here
    return value
