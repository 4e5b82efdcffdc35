"""A rank slower than the others is named by rank 0, with what is slow in it, and ``perf/straggler_ratio`` logged;
ranks of equal speed are not (the run of ``test_stack_dumps.py``'s SIGUSR2 test, paced alike, prints no line)."""

from __future__ import annotations

import sys

import pytest

from multigpu.observe.straggler import StragglerReport, describe_straggler, find_straggler, straggler_ratio
from tests import prewarmed
from tests.cli import TemplateCLI
from tests.conftest import REPO, TINY, cli_env, read_metrics


def test_the_slowest_rank_is_named_only_past_the_factor_and_the_minimum_excess():
    even = [(0.100, 0.010), (0.105, 0.010), (0.098, 0.012), (0.101, 0.011)]
    assert find_straggler(even, factor=1.3, min_excess_s=0.02) is None
    assert straggler_ratio(even) == pytest.approx(0.115 / 0.111, rel=1e-3)
    slow_compute = [*even, (0.300, 0.010)]
    straggler = find_straggler(slow_compute, factor=1.3, min_excess_s=0.02)
    assert straggler is not None and straggler.rank == 4 and straggler.cause == "compute"
    slow_data = [(0.100, 0.010), (0.100, 0.400), (0.100, 0.010)]
    straggler = find_straggler(slow_data, factor=1.3, min_excess_s=0.02)
    assert straggler is not None and straggler.rank == 1 and straggler.cause == "data"
    line = describe_straggler(straggler, "1-10")
    assert line.startswith("straggler: rank 1 takes 0.500 s per batch") and "the ranks' median 0.110 s (4.5x)" in line
    assert "slow disk or loader" in line and "\n" not in line
    tiny = [(0.001, 0.0), (0.004, 0.0)]  # four times slower, by 3 ms: noise of tiny steps
    assert find_straggler(tiny, factor=1.3, min_excess_s=0.02) is None
    assert straggler_ratio([(0.0, 0.0), (0.0, 0.0)]) == 1.0


def test_the_factor_is_an_option_and_the_callback_can_be_left_out():
    def stragglers(*args: str) -> list[StragglerReport]:
        callbacks = TemplateCLI(args=[*TINY, *args], run=False).trainer.callbacks
        return [c for c in callbacks if isinstance(c, StragglerReport)]

    assert [c.factor for c in stragglers("--straggler.factor=1.5")] == [1.5]
    assert stragglers("--callbacks_off=[straggler]") == []
    with pytest.raises(ValueError, match="must be above 1"):
        StragglerReport(factor=1.0)


@pytest.mark.slow
def test_a_rank_that_sleeps_in_its_training_step_is_named_by_rank_0(tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "tests.cli", "fit", *TINY, "--trainer.accelerator=cpu", "--trainer.strategy=ddp",
        "--trainer.devices=2", "--progress_bar=none", "--trainer.max_steps=15", "--trainer.log_every_n_steps=5",
        "--trainer.limit_val_batches=0", "--model=tests.zoo.stuck.SleepyClassifier",
        "--model.init_args.slow_seconds=0.15", "--collective_timeout=20", f"--trainer.default_root_dir={run_dir}",
    ]  # fmt: skip
    result = prewarmed.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("straggler: ")]
    assert len(lines) == 1, result.stderr[-3000:]  # named once, not at every interval
    assert lines[0].startswith("straggler: rank 1 takes 0.1") and "Slow part: compute" in lines[0]
    ratios = [float(row["perf/straggler_ratio"]) for row in read_metrics(run_dir) if row.get("perf/straggler_ratio")]
    assert len(ratios) == 3 and min(ratios) > 1.5  # (0.15 + a few ms) over the median of two ranks
