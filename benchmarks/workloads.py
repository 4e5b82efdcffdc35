"""The benchmark's workloads: named sets of ``python -m src.cli fit`` flags, read by every row through the CLI.

The template rows pass ``cli_flags`` to ``python -m src.cli fit``; the baselines (``benchmarks/plain.py``,
``benchmarks/bare.py``) pass the same flags to ``CLI(run=False)`` and take its model, data module,
optimizer and trainer options. One config system builds all rows, so they train the same network, with the same
initialisation, optimizer, scheduler, gradient clipping and data.

Two kinds: the built-in workloads (``WORKLOADS``, the example image and language models) and a user's own
(``user_workload``: ``--model=PKG.Class --data=PKG.Class`` and/or ``--config FILE``). A built-in workload takes
what it trains from its own preset (``configs/experiment/``: model, optimizer, scheduler, data, seed, gradient
clipping, accumulation, checkpoint metric), so it stays the same when ``configs/default.yaml`` names a project's
model; from ``configs/default.yaml``, as every run, it takes how the template runs (logger, callbacks). Nothing
here imports the examples: a copy of the template without them still runs the benchmark on its own model.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import REPO


@dataclass(frozen=True)
class Workload:
    """A named training job: config files (after ``configs/default.yaml``) and dotted-key overrides.

    ``requires``: the repository files of a built-in workload (absent once the examples are removed);
    ``builtin``: False for a user's model, which has no plain PyTorch baseline and no ``--quick`` variant;
    ``counts_tokens``: throughput in tokens too (the built-in language model); ``batch_per_process``: the data
    module's ``batch_size`` is per process (a plain ``LightningDataModule``), not global; ``tensor_parallel_plan``:
    the model has a ``configure_model`` hook (a tensor-parallel plan), ``model_name`` its class; both known once the
    workload is built (``with_model``).
    """

    name: str
    description: str
    configs: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)
    quick_overrides: dict[str, Any] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    builtin: bool = True
    counts_tokens: bool = False
    batch_per_process: bool = False
    tensor_parallel_plan: bool = False
    #: whether the model defines the hooks of ``--trainer.strategy=pipeline``
    pipeline_stages: bool = False
    model_name: str = ""

    def settings(self, quick: bool) -> dict[str, Any]:
        return {**self.overrides, **(self.quick_overrides if quick else {})}

    def available(self) -> bool:
        """Whether its files are in this copy of the template (a user's workload: always)."""
        return all((REPO / path).exists() for path in (*self.requires, *self.configs))

    def missing(self) -> list[str]:
        return [path for path in (*self.requires, *self.configs) if not (REPO / path).exists()]

    def arguments(self) -> list[str]:
        """How ``python -m benchmarks.plain`` is told to build this workload."""
        if self.builtin:
            return [f"--workload={self.name}"]
        flags = [f"--config={path}" for path in self.configs]
        return flags + [f"--{key}={value}" for key, value in self.overrides.items()]

    def data_batch_size(self, global_batch: int, processes: int) -> int:
        """The data module's ``batch_size`` for a run of ``processes`` processes at this global batch."""
        return global_batch // processes if self.batch_per_process else global_batch


WORKLOADS: dict[str, Workload] = {
    "image": Workload(
        name="image",
        description="ImageClassifier (CompactResNet, GroupNorm) on the synthetic 32x32 set, AdamW",
        # its preset sets the model, optimizer, data, seed, clipping and accumulation: configs/default.yaml, which
        # a project points at its own model, changes none of them
        configs=("configs/experiment/image_synthetic.yaml",),
        requires=("src/models/image_classifier.py", "src/data/images.py"),
        quick_overrides={
            "model.init_args.widths": [8, 16],
            "data.init_args.synthetic_train_size": 2048,
            "data.init_args.synthetic_val_size": 64,
            "data.init_args.batch_size": 32,
        },
    ),
    "gpt": Workload(
        name="gpt",
        description="CausalLanguageModel (byte-level GPT) on the embedded corpus, AdamW + cosine, clip 1.0",
        configs=("configs/experiment/gpt.yaml",),
        requires=("src/models/gpt.py", "src/data/text.py"),
        counts_tokens=True,
        quick_overrides={
            "model.init_args.n_layer": 2,
            "model.init_args.n_head": 2,
            "model.init_args.n_embd": 32,
            "model.init_args.block_size": 32,
            "data.init_args.block_size": 32,
            "data.init_args.corpus_chars": 40000,
            "data.init_args.batch_size": 16,
        },
    ),
}


#: the built-in workloads' files, for the message that says they were removed
EXAMPLE_FILES = sorted({path for workload in WORKLOADS.values() for path in (*workload.requires, *workload.configs)})


def user_workload(model: str | None, data: str | None, configs: list[str] | None) -> Workload | None:
    """The workload of ``--model``, ``--data`` and ``--config`` (None if none is given); named once built."""
    if not (model or data or configs):
        return None
    overrides = {key: value for key, value in (("model", model), ("data", data)) if value}
    paths = tuple(str(Path(path).resolve()) for path in configs or ())
    return Workload(name="user", description="", configs=paths, overrides=overrides, builtin=False)


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--data`` and ``--config``: a user's workload, as ``python -m src.cli fit`` takes them."""
    parser.add_argument("--model", metavar="PKG.Class", help="your LightningModule, as `--model` of src.cli fit")
    parser.add_argument(
        "--data", metavar="PKG.Class", help="your LightningDataModule (with a batch_size argument), as `--data`"
    )
    parser.add_argument(
        "--config",
        action="append",
        metavar="FILE",
        help="a `python -m src.cli fit` config naming model and data (repeatable; read before --model/--data)",
    )


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload of ``add_workload_arguments``' options, else the built-in ``args.workload``."""
    user = user_workload(args.model, args.data, args.config)
    return user if user is not None else WORKLOADS[args.workload]


def named(workload: Workload, cli: Any) -> Workload:
    """A user's workload with its name and description from the model and data module the CLI built."""
    if workload.builtin:
        return workload
    model, data = type(cli.model), type(cli.datamodule)
    return replace(
        workload,
        name=model.__name__,
        description=f"{model.__module__}.{model.__qualname__} on {data.__module__}.{data.__qualname__}"
        + "".join(f", {Path(path).name}" for path in workload.configs),
        batch_per_process=not batch_is_global(cli),
    )


def with_model(workload: Workload, cli: Any) -> Workload:
    """The workload with what its built model tells: its class name, whether it has a tensor-parallel plan and
    pipeline stages."""
    from lightning.pytorch.utilities.model_helpers import is_overridden  # as the tensor_parallel strategy checks

    from multigpu.hooks.readers import missing_pipeline_hooks

    model = cli.model
    return replace(
        workload,
        model_name=type(model).__name__,
        tensor_parallel_plan=is_overridden("configure_model", model),
        pipeline_stages=not missing_pipeline_hooks(model),
    )


def batch_is_global(cli: Any) -> bool:
    """Whether the data module's ``batch_size`` is the global batch (the template's ``GlobalBatchDataModule``)."""
    from multigpu.data.base import GlobalBatchDataModule

    return isinstance(cli.datamodule, GlobalBatchDataModule)


def has_batch_size(cli: Any) -> bool:
    """Whether the data module takes ``batch_size``: the benchmark sets each row's batch through it."""
    init_args = (cli.config.get("data") or {}).get("init_args") or {}
    return "batch_size" in init_args and hasattr(cli.datamodule, "batch_size")


def cli_flags(workload: Workload, quick: bool, extra: dict[str, Any] | None = None) -> list[str]:
    """``--config`` and ``--key=value`` arguments that make ``python -m src.cli fit`` train this workload."""
    flags = [f"--config={REPO / name}" for name in workload.configs]
    for key, value in {**workload.settings(quick), **(extra or {})}.items():
        text = value if isinstance(value, str) else json.dumps(value)
        flags.append(f"--{key}={text}")
    return flags


def build_cli(workload: Workload, quick: bool, batch_size: int | None = None) -> Any:
    """The workload as ``python -m src.cli fit`` configures it: ``cli.model``, ``cli.datamodule``, ``cli.trainer``.

    The CLI seeds (``seed_everything``) before it builds the model, so every row starts from the same weights.
    Its Trainer is a one-process CPU trainer without a logger: the baselines only read its options.
    """
    from src.cli import CLI  # Lightning and the engine: only where a workload is built

    extra: dict[str, Any] = {"data.init_args.batch_size": batch_size} if batch_size else {}
    flags = cli_flags(workload, quick, extra)
    trainer = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.logger=false"]
    return CLI(args=[*flags, *trainer], run=False)


def optimizer_and_scheduler(model: Any) -> tuple[Any, Any]:
    """(optimizer, LR scheduler or None) from the model's own ``configure_optimizers``."""
    configured = model.configure_optimizers()
    if not isinstance(configured, dict):
        return configured, None
    return configured["optimizer"], configured["lr_scheduler"]["scheduler"]


def global_batch_size(cli: Any) -> int:
    return int(cli.datamodule.batch_size)


def training_flops(cli: Any, workload: Workload) -> dict[str, float]:
    """``{"flops_per_sample": x}`` or ``{"flops_per_batch": y}`` (one micro-batch of one process), or ``{}``.

    The built-in language model counts per sequence of the configured length; a user's module is read as the
    throughput monitor reads it (``multigpu/observe/throughput.py``).
    """
    if workload.builtin:
        flops = flops_per_sample(cli)
        return {"flops_per_sample": flops} if flops else {}
    from multigpu.observe.throughput import module_flops

    found = module_flops(cli.model)
    return {found[0]: found[1]} if found else {}


def tokens_per_sample(cli: Any) -> int | None:
    """Tokens per sequence for the language model; None for other workloads."""
    block_size = getattr(cli.datamodule, "block_size", None)
    return int(block_size) if block_size else None


def flops_per_sample(cli: Any) -> float | None:
    """Forward plus backward FLOPs of one training sample, as the model counts them (its ``flops_per_sample``)."""
    if not hasattr(cli.model, "flops_per_sample"):
        return None
    tokens = tokens_per_sample(cli)
    return float(cli.model.flops_per_sample(tokens) if tokens is not None else cli.model.flops_per_sample())
