"""multigpu: the engine under a Lightning project that trains the same model on one CPU, one GPU, several GPUs
and SLURM clusters. The public interface is ``__all__`` (docs/engine.md); every other module may change in any
release."""

from __future__ import annotations

import importlib
from typing import Any

from multigpu import moved

moved.install()  # the 1.x module names, through 2.x

__version__ = "2.1.1"

#: imported when first used, so that ``import multigpu`` stays cheap
_PUBLIC = {
    "TemplateCLI": "multigpu.run.cli",
    "run_cli": "multigpu.run.cli",
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
    "FILE_SYSTEM_ERRNOS": "multigpu.errors.failures",
    "file_system_failure": "multigpu.errors.failures",
    "network_failure": "multigpu.errors.failures",
    "is_network_error": "multigpu.errors.failures",
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
    globals()[name] = value
    return value
