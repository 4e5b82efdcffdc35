"""scripts/gpu_check.sh, the GPU check, run dry on this CPU (``GPU_CHECK_DRY_RUN=1``): every part starts, with
tiny sizes, and writes its outputs, so a mistake shows before a GPU runs it; its wheels cover what the
GPU machine lacks; and scripts/sync_count.py counts per step what it is told to (the dry run, which trains the
examples: tests/examples/test_gpu_check_dry_run.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, requires

import lightning as L
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import sync_count

#: what the GPU machine's python has (the check installs the rest from scripts/gpu_wheels/)
ON_THE_GPU_MACHINE = {"torch", "lightning", "torchmetrics", "rich", "tensorboard", "matplotlib", "pytest"}
#: imported only where a config names its logger (configs/logger/wandb.yaml), which the check does not
NOT_NEEDED = {"wandb"}
WHEELS = REPO / "scripts" / "gpu_wheels"
PARTS = ["setup", "gpu_tests", "users", "syncs", "bench_gpt", "mfu", "nvtx", "stall", "bench_image"]


def wheel_names() -> set[str]:
    return {canonicalize_name(path.name.split("-")[0]) for path in WHEELS.glob("*.whl")}


def requirements(name: str, extras: set[str] = frozenset()) -> set[Requirement]:
    """What the installed distribution ``name`` requires with these extras, on the GPU machine's Python 3.12."""
    found = set()
    for text in requires(name) or []:
        requirement = Requirement(text)
        markers = [{"python_version": "3.12", "extra": extra} for extra in extras or {""}]
        if requirement.marker is None or any(requirement.marker.evaluate(env) for env in markers):
            found.add(requirement)
    return found


def provided() -> set[str]:
    """The GPU machine's packages and everything they require (lightning brings PyYAML, fsspec, ...)."""
    names, todo = set(), [*ON_THE_GPU_MACHINE]
    while todo:
        name = canonicalize_name(todo.pop())
        if name not in names:
            names.add(name)
            # one not installed here (matplotlib, an extra) counts as itself, without what it brings
            with contextlib.suppress(PackageNotFoundError):
                todo += [r.name for r in requirements(name)]
    return names


def test_the_wheels_hold_every_dependency_the_gpu_machine_lacks():
    # pyproject's dependencies, as the installed project declares them (not its extras: dev, bench, sweep)
    direct = [r for r in requirements("lightning-multigpu") if r.name not in NOT_NEEDED]
    needed = {canonicalize_name(r.name) for r in direct}
    for requirement in direct:  # with what each needs under its extras (jsonargparse[signatures])
        needed |= {canonicalize_name(r.name) for r in requirements(requirement.name, requirement.extras)}
    assert needed - provided() - wheel_names() == set()
    assert {"jsonargparse", "docstring-parser", "typeshed-client"} <= wheel_names()
    # the GPU tests run under pyproject's addopts (-n, timeout), and the project builds with no index
    assert {"pytest-xdist", "execnet", "pytest-timeout", "setuptools"} <= wheel_names()
    assert all(path.name.endswith("-py3-none-any.whl") for path in WHEELS.glob("*.whl"))  # any Python 3


class ItemsPerStep(L.LightningModule):
    """A linear model whose training step reads ``reads`` values to the host (``Tensor.item``), as user code does."""

    def __init__(self, reads: int) -> None:
        super().__init__()
        self.reads = reads
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).square().mean()
        for _ in range(self.reads):
            loss.item()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def counted(reads: int, warmup: int = 2, steps: int = 3) -> sync_count.SyncCounter:
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 2)), batch_size=4)
    with sync_count.stand_in() as switch:
        counter = sync_count.SyncCounter(warmup, steps, switch)
        trainer = L.Trainer(
            accelerator="cpu", max_steps=warmup + steps + 1, callbacks=[counter], logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(ItemsPerStep(reads), data)
    return counter


def test_the_sync_counter_counts_each_step_after_the_warmup():
    plain, reading = counted(reads=0), counted(reads=3)
    assert len(plain.per_step) == len(reading.per_step) == 3
    assert [b - a for a, b in zip(plain.per_step, reading.per_step, strict=True)] == [3, 3, 3]
    sites = {entry["site"]: entry["count"] for entry in reading.summary()["sites"]}
    assert sum(count for site, count in sites.items() if "training_step" in site.split(" <- ")[0]) == 9
    assert torch.tensor(1.0).item() == 1.0  # the stand-in is gone: no warning outside the counted steps


def test_without_a_gpu_the_check_says_so_and_runs_nothing(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_SITE": str(tmp_path / "site")}
    env.pop("GPU_CHECK_DRY_RUN", None)
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "PyTorch sees no CUDA GPU" in result.stdout and "GPU_CHECK_DRY_RUN=1" in result.stdout
    assert [line.split()[0] for line in (tmp_path / "summary.txt").read_text().splitlines()] == ["setup", "PyTorch"]
    assert not (tmp_path / "gpu_tests.log").exists()
