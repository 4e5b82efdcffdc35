"""The benchmark's workloads: named sets of ``python -m src.cli fit`` flags, read by every row through the CLI.

The template rows pass ``cli_flags`` to ``python -m src.cli fit``; the baselines (``src/bench/plain.py``,
``src/bench/bare.py``) pass the same flags to ``TemplateCLI(run=False)`` and take its model, data module,
optimizer and trainer options. One config system builds all rows, so they train the same network, with the same
initialisation, optimizer, scheduler, gradient clipping and data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Workload:
    """A named training job: config files (after ``configs/default.yaml``) and dotted-key overrides."""

    name: str
    description: str
    configs: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)
    quick_overrides: dict[str, Any] = field(default_factory=dict)

    def settings(self, quick: bool) -> dict[str, Any]:
        return {**self.overrides, **(self.quick_overrides if quick else {})}


WORKLOADS: dict[str, Workload] = {
    "image": Workload(
        name="image",
        description="ImageClassifier (CompactResNet, GroupNorm) on the synthetic 32x32 set, AdamW",
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
    from src.cli import TemplateCLI  # Lightning and the template: only where a workload is built

    extra: dict[str, Any] = {"data.init_args.batch_size": batch_size} if batch_size else {}
    flags = cli_flags(workload, quick, extra)
    trainer = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.logger=false"]
    return TemplateCLI(args=[*flags, *trainer], run=False)


def optimizer_and_scheduler(model: Any) -> tuple[Any, Any]:
    """(optimizer, LR scheduler or None) from the model's own ``configure_optimizers``."""
    configured = model.configure_optimizers()
    if not isinstance(configured, dict):
        return configured, None
    return configured["optimizer"], configured["lr_scheduler"]["scheduler"]


def global_batch_size(cli: Any) -> int:
    return int(cli.datamodule.batch_size)


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
