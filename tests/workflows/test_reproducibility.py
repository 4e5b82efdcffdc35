"""Same seed, same run: identical metrics and weights, also with --trainer.deterministic=true and under ddp.

The ddp run also trains, in fp32, what one process trains to rounding (fp64 shows the math is identical:
tests/strategies/test_same_model.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.cli import main
from tests.conftest import TINY, cli_env, load_state, read_metrics, relative_difference

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


@contextmanager
def every_core_busy() -> Iterator[None]:
    """A busy loop per core while the block runs: another user's load, which changes how the run's threads are
    scheduled, not what they compute."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


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
@pytest.mark.extended
def test_the_same_command_twice_gives_the_same_run_also_on_a_loaded_machine(tmp_path, run_cli):
    """As a user runs it: fresh processes (each its own hash seed), every core's thread (not the suite's one),
    dropout on, no --trainer.deterministic, the second run while every core is busy: the same weights, optimizer
    state and metrics, bit for bit."""
    threads = str(os.cpu_count() or 1)
    args = ["fit", *SHORT, "--model.init_args.hidden=512", "--model.init_args.dropout=0.1"]
    env = cli_env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    run_cli(*args, f"--trainer.default_root_dir={tmp_path / 'a'}", env=env, fresh=True)
    with every_core_busy():
        run_cli(*args, f"--trainer.default_root_dir={tmp_path / 'b'}", env=env, fresh=True)
    assert_same_run(tmp_path / "a", tmp_path / "b")
    a, b = (torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True) for run in "ab")
    assert a["global_step"] == b["global_step"] == 8
    state_a, state_b = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[i][key], state_b[i][key]) for i in state_a for key in state_a[i])


@pytest.mark.slow
@pytest.mark.extended
def test_ddp_run_is_reproducible_run_to_run_with_deterministic_algorithms(tmp_path, run_cli):
    """Two processes over gloo, twice, the second while every core is busy: the same metrics and weights, and in
    fp32 the weights of one process to rounding; the plan and throughput speak for both."""
    common = [*SHORT, "--config", "configs/trainer/ddp_cpu.yaml", "--trainer.deterministic=true"]

    def fit_ddp(run: str) -> str:
        # fresh interpreters: forked ones would share rank 0's hash seed, which could hide an order that varies
        return run_cli("fit", *common, f"--trainer.default_root_dir={tmp_path / run}", timeout=240, fresh=True).stdout

    outputs = [fit_ddp("a")]
    with every_core_busy():
        outputs.append(fit_ddp("b"))
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
