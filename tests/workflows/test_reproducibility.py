"""Same seed, same run: identical metrics and weights, also with --trainer.deterministic=true and under ddp.

The ddp run also trains, in fp32, what one process trains to rounding (fp64 shows the math is identical:
tests/strategies/test_same_model.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.cli import main
from tests.conftest import TINY, load_state, read_metrics, relative_difference

SHORT = [*TINY, "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2", "--trainer.max_epochs=2"]
SHORT += ["--trainer.log_every_n_steps=2", "--progress_bar=none"]


def training_metrics(run_dir: Path) -> list[dict[str, str]]:
    """Every logged row without the wall-clock figures (``perf/*``), which measure the machine, not the model."""
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in read_metrics(run_dir)]


def assert_same_run(a: Path, b: Path) -> None:
    assert training_metrics(a) == training_metrics(b)
    weights_a, weights_b = load_state(a / "checkpoints" / "last.ckpt"), load_state(b / "checkpoints" / "last.ckpt")
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def fit(run_dir: Path, *args: str) -> Path:
    main(["fit", *SHORT, *args, f"--trainer.default_root_dir={run_dir}"])
    return run_dir


def test_same_seed_gives_identical_runs_and_another_seed_a_different_one(tmp_path):
    first = fit(tmp_path / "a", "--trainer.deterministic=true")
    second = fit(tmp_path / "b", "--trainer.deterministic=true")
    assert len(training_metrics(first)) >= 6  # train rows and validation rows were compared
    assert_same_run(first, second)

    other = fit(tmp_path / "c", "--trainer.deterministic=true", "--seed_everything=43")
    losses = [[row["train/loss"] for row in training_metrics(run) if row["train/loss"]] for run in (first, other)]
    assert losses[0] and losses[0] != losses[1]
    weights, other_weights = (load_state(run / "checkpoints" / "last.ckpt") for run in (first, other))
    assert not torch.equal(weights["net.0.weight"], other_weights["net.0.weight"])


@pytest.mark.slow
def test_ddp_run_is_reproducible_run_to_run_with_deterministic_algorithms(tmp_path, run_cli):
    """Two processes over gloo, twice: the same metrics and weights, and in fp32 the weights of one process to
    rounding; the plan and throughput speak for both."""
    common = [*SHORT, "--config", "configs/trainer/ddp_cpu.yaml", "--trainer.deterministic=true"]
    outputs = [
        run_cli("fit", *common, f"--trainer.default_root_dir={tmp_path / run}", timeout=240, fresh=True).stdout
        for run in "ab"
    ]  # fresh interpreters: forked ones would share rank 0's hash seed, which could hide an order that varies
    assert_same_run(tmp_path / "a", tmp_path / "b")
    # fp32 ddp against one process (trained in this one): the same global batches, their gradients summed in
    # another order; measured 5e-8, under fp32's epsilon (1.2e-7), and the same on 1 thread as on 2
    single = fit(tmp_path / "single", "--trainer.deterministic=true")
    weights = [load_state(run / "checkpoints" / "last.ckpt") for run in (single, tmp_path / "a")]
    assert relative_difference(*weights) < 1e-6
    assert outputs[0].count("Run plan") == 1  # printed by rank 0 only
    plan = json.loads((tmp_path / "a" / "logs" / "version_0" / "run_plan.json").read_text())
    assert plan["world_size"] == 2 and plan["micro_batch_per_process"] == 16 and plan["global_batch"] == 32
    assert plan["strategy"] == "DDPStrategy" and plan["deterministic"] is True
    rows = read_metrics(tmp_path / "a")
    total = [float(r["perf/samples_per_s"]) for r in rows if r.get("perf/samples_per_s")]
    per_device = [float(r["perf/samples_per_s_per_device"]) for r in rows if r.get("perf/samples_per_s_per_device")]
    assert total and total == pytest.approx([2 * p for p in per_device])
