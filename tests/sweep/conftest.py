"""What the tests of multigpu/sweep/ share (and tests/workflows/test_slurm_sweep.py): a sweep file of the tests'
workload, ``python -m multigpu.sweep`` in a subprocess, and what a trial's run directory says it trained."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from tests import prewarmed
from tests.conftest import TINY_CONFIG, cli_env, project_folder, read_metrics

LR = "model.init_args.optimizer.init_args.lr"
BATCH = "data.init_args.batch_size"
MAX_STEPS = 8  # 16 steps per epoch: validations at steps 4 and 8 (val_check_interval=4)
FIT = [
    "--config",
    str(TINY_CONFIG),
    f"--trainer.max_steps={MAX_STEPS}",
    "--trainer.val_check_interval=4",
    "--trainer.log_every_n_steps=1",
    "--progress_bar=none",
]


def write_sweep(folder: Path, **overrides: Any) -> Path:
    """A sweep file of the tests' workload; keyword arguments replace its top-level keys (None removes one)."""
    content: dict[str, Any] = {
        "fit": FIT,
        "objective": {"metric": "val/loss", "mode": "min"},
        "trials": 2,
        "sampler": {"name": "random", "seed": 0},
        "space": {LR: {"low": 1.0e-3, "high": 1.0e-1, "log": True}, BATCH: {"choices": [16, 32]}},
    }
    content.update(overrides)
    content = {k: v for k, v in content.items() if v is not None}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def sweep_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    result = prewarmed.run(
        [sys.executable, "-m", "multigpu.sweep", *args],
        cwd=project_folder(),  # its trials run the tests' command line
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result


def final_step(folder: Path) -> int:
    return torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]


def trained_steps(folder: Path, version: int | None = None) -> list[int]:
    """The step of every train/loss row of one start (or of all starts) of a run (log_every_n_steps=1)."""
    count = len(list((folder / "logs").glob("version_*")))
    versions = range(count) if version is None else [version]
    return [int(row["step"]) for v in versions for row in read_metrics(folder, v) if row.get("train/loss")]


def assert_resumed_once(folder: Path, saved: int) -> None:
    """A run stopped once at step ``saved``: its second start trained exactly the steps after it, the first none
    after it (the first start may lack the row of the step it stopped at: the stop comes before that row)."""
    before, after = trained_steps(folder, 0), trained_steps(folder, 1)
    assert max(before) < saved and after == list(range(saved, MAX_STEPS)), (before, after)
