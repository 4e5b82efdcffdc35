"""When the first process fails, the ranks it started are stopped at once (multigpu/callbacks/stop_other_ranks.py);
after a stop every rank agreed on, they are waited for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import lightning as L
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

from multigpu.callbacks import stop_other_ranks
from multigpu.callbacks.stop_other_ranks import STOPPED_RANKS_GRACE_S, StopOtherRanksOnError
from multigpu.errors import TrainingStopped
from tests.test_errors import TINY_RUN, run_cli


def ddp_trainer_with_ranks(count: int) -> tuple[L.Trainer, list[subprocess.Popen]]:
    """A two-process ddp Trainer (not started) whose launcher watches ``count`` running processes, as the first
    process watches the ranks it started."""
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False, enable_checkpointing=False)
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(count)]
    trainer.strategy.launcher.procs.extend(ranks)
    return trainer, ranks


def test_a_failure_kills_the_ranks_this_process_started():
    trainer, ranks = ddp_trainer_with_ranks(2)
    StopOtherRanksOnError().on_exception(trainer, BoringModel(), RuntimeError("rank 0 failed"))
    assert [rank.wait(timeout=10) for rank in ranks] == [-signal.SIGKILL] * 2
    assert trainer.strategy.launcher.procs == []  # out of Lightning's watch, which would kill this process


def test_an_agreed_stop_waits_for_the_ranks_at_exit_instead(monkeypatch):
    registered = []
    monkeypatch.setattr(stop_other_ranks.atexit, "register", lambda *call: registered.append(call))
    trainer, ranks = ddp_trainer_with_ranks(1)
    StopOtherRanksOnError().on_exception(trainer, BoringModel(), TrainingStopped("stopped at step 3", exit_code=75))
    assert ranks[0].poll() is None  # still running: it saves and exits with the same status
    assert registered == [(stop_other_ranks.wait_for_exit, ranks, STOPPED_RANKS_GRACE_S)]
    ranks[0].kill()
    ranks[0].wait(timeout=10)


def test_one_process_has_no_ranks_to_stop():
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    StopOtherRanksOnError().on_exception(trainer, BoringModel(), RuntimeError("failed"))  # nothing to stop


class FailAtStep(L.Callback):
    """Test-only: on rank ``rank``, after optimizer step ``step``, raise (``how="raise"``) or SIGKILL itself."""

    def __init__(self, step: int = 3, rank: int = 1, how: str = "raise") -> None:
        self.step, self.rank, self.how = step, rank, how

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"rank {self.rank} fails at step {self.step}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "rank", "how"),
    # rank 1 raising under ddp: test_the_rank_that_raised_first_is_the_error_read_last (test_stack_dumps.py)
    [("ddp", 0, "raise"), ("ddp", 1, "kill"), ("ddp_spawn", 1, "raise")],
)
def test_a_failing_rank_stops_every_process_promptly(tmp_path, strategy, rank, how):
    result, seconds = run_cli(
        "fit",
        *TINY_RUN,
        "--trainer.accelerator=cpu",
        f"--trainer.strategy={strategy}",
        "--trainer.devices=2",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=20",
        "--trainer.callbacks+=tests.callbacks.test_stop_other_ranks.FailAtStep",
        f"--trainer.callbacks.rank={rank}",
        f"--trainer.callbacks.how={how}",
    )
    assert result.returncode != 0
    assert seconds < 60
    if how == "raise":
        error = f"RuntimeError: rank {rank} fails at step 3"
        lines = result.stderr.splitlines()
        assert sum(line.endswith(error) for line in lines) == 1, result.stderr  # its traceback, once
        # a rank that lost it in a collective ends the output with that first failure, in one line
        assert error in lines[-1] or lines[-1].endswith(error), result.stderr
    # a rank still waiting in a collective may add gloo's own error for the lost connection, which points at the
    # failing rank ("This is typically caused by a remote worker ..."); nothing else
    others = result.stderr.count("Traceback") - (how == "raise")
    assert others == 0 or (others == 1 and "remote worker" in result.stderr), result.stderr
    assert result.stderr.count("stopped: ") <= 1, result.stderr
