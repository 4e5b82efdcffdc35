"""``RunCheckpoint``: ``last.ckpt`` at every validation and every interval of its schedule whatever
``--checkpoint.monitor`` names, so that a crash loses at most the steps since the last of them; ``best-<step>.ckpt``
and ``last.ckpt`` of one save written once."""

from __future__ import annotations

import random
import re
import signal
from datetime import timedelta
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from multigpu.checkpoints.schedule import interval_due
from tests.cli import main
from tests.conftest import TINY, load_state
from tests.faults.test_preemption import COMMON, best_checkpoint, start, validation_rows
from tests.helpers import hold_at, lines, wait_for

#: a user's model that logs ``val/mse``, not the default monitor ``val/loss``; 16 optimizer steps per epoch
REGRESSION = [
    "--trainer.accelerator=cpu",
    "--trainer.enable_model_summary=false",
    "--progress_bar=none",
    "--model=tests.zoo.regression.Regressor",
    "--data=tests.zoo.regression.GlobalRegressionData",
    "--data.init_args.batch_size=4",
    "--trainer.max_epochs=2",
]


def test_a_run_whose_model_does_not_log_the_monitor_keeps_last_ckpt_of_its_last_validation(tmp_path):
    run_dir = tmp_path / "run"
    args = ["fit", *REGRESSION, f"--trainer.default_root_dir={run_dir}"]
    crash = ["--trainer.callbacks+=tests.helpers.CrashAtStep", "--trainer.callbacks.step=20"]
    with (
        pytest.warns(UserWarning, match="--checkpoint.monitor=val/loss is not logged by this model"),
        pytest.raises(RuntimeError, match="crashed at step 20"),
    ):
        main([*args, *crash])
    last = run_dir / "checkpoints" / "last.ckpt"
    assert [p.name for p in last.parent.iterdir()] == ["last.ckpt"]  # no best-*.ckpt without the metric
    assert torch.load(last, weights_only=True)["global_step"] == 16  # the first epoch's validation
    main([*args, "--ckpt_path=last"])  # the crashed run resumes from it and finishes
    assert torch.load(last, weights_only=True)["global_step"] == 32


# -- on schedule: last.ckpt at every interval, before any validation -------------------------------------------

#: the tests' workload in fp64 with dropout, a checkpoint every 2 steps and the first validation at step 6
SCHEDULED = [
    *TINY,
    "--progress_bar=none",
    "--trainer.precision=64-true",
    "--model.init_args.dropout=0.2",
    "--trainer.max_steps=12",
    "--trainer.max_epochs=-1",
    "--trainer.limit_val_batches=2",
    "--trainer.val_check_interval=6",
    "--trainer.check_val_every_n_epoch=null",
    "--checkpoint.every_n_train_steps=2",
]


def crash_at(step: int) -> list[str]:
    return ["--trainer.callbacks+=tests.helpers.CrashAtStep", f"--trainer.callbacks.step={step}"]


def test_every_n_train_steps_writes_last_ckpt_before_any_validation_and_resumes_exactly(tmp_path):
    """Crashed before the first validation, the run has the last interval's last.ckpt (and no best file: the
    metric does not exist yet); crashed after it, best-6.ckpt and last.ckpt are one file. Resumed each time, the run
    ends as an uninterrupted one, bit for bit."""
    run_dir, straight = tmp_path / "run", tmp_path / "straight"
    args = ["fit", *SCHEDULED, f"--trainer.default_root_dir={run_dir}"]
    folder = run_dir / "checkpoints"
    with pytest.raises(RuntimeError, match="crashed at step 5"):
        main([*args, *crash_at(5)])
    assert [p.name for p in folder.iterdir()] == ["last.ckpt"]
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 4
    with pytest.raises(RuntimeError, match="crashed at step 7"):
        main([*args, "--ckpt_path=last", *crash_at(7)])
    assert sorted(p.name for p in folder.iterdir()) == ["best-6.ckpt", "last.ckpt"]
    assert (folder / "best-6.ckpt").stat().st_ino == (folder / "last.ckpt").stat().st_ino  # written once
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 6  # after its validation
    main([*args, "--ckpt_path=last"])
    main(["fit", *SCHEDULED, f"--trainer.default_root_dir={straight}"])
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in (straight / "checkpoints").iterdir())
    a, b = load_state(straight / "checkpoints" / "last.ckpt"), load_state(folder / "last.ckpt")
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.slow
def test_a_run_killed_before_its_first_validation_resumes_from_its_last_interval_exactly(tmp_path):
    """SIGKILL at a random step of a run that checkpoints every step (in the background) and first validates at
    step 30: ``--ckpt_path=last`` resumes from a step at most two before the kill, and the finished run equals an
    uninterrupted one (fp64, dropout on): weights bit for bit, the validation rows, the best checkpoint."""
    schedule = ["--checkpoint.every_n_train_steps=1", "--trainer.val_check_interval=30",
                "--trainer.check_val_every_n_epoch=null"]  # fmt: skip
    kill_after = random.randint(2, 25)
    run_dir, straight, progress = tmp_path / "run", tmp_path / "straight", tmp_path / "progress"
    # held at step 29 until the kill: it lands before the validation at 30 however late it comes
    process = start(run_dir, *schedule, *hold_at(29, tmp_path / "held", progress_file=progress))
    wait_for(lambda: len(lines(progress)) >= kill_after, f"step {kill_after}", process=process)
    process.kill()
    process.wait()
    reached = len(lines(progress))
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert reached - 2 <= saved <= reached + 1 and saved < 30, (kill_after, reached, saved)
    main(["fit", *COMMON, *schedule, f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last"])
    main(["fit", *COMMON, *schedule, f"--trainer.default_root_dir={straight}"])
    assert validation_rows(run_dir) == validation_rows(straight)  # step 30's, once
    assert best_checkpoint(run_dir) == best_checkpoint(straight)
    a, b = load_state(straight / "checkpoints" / "last.ckpt"), load_state(run_dir / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a), kill_after


@pytest.mark.slow
def test_sigterm_while_a_background_write_is_in_progress_saves_its_step_before_exiting(tmp_path):
    """Checkpoints of 16 MB and more every step, written in the background: a SIGTERM lands while one is written;
    the stop's save waits for it, writes its own step, and is on disk when the process exits."""
    run_dir = tmp_path / "run"
    ballast = ["--trainer.callbacks+=tests.helpers.Ballast", "--trainer.callbacks.megabytes=16"]
    held = tmp_path / "held"
    every_step = ["--checkpoint.every_n_train_steps=1", "--trainer.limit_val_batches=0"]
    process = start(run_dir, *every_step, *ballast, *hold_at(3, held))
    wait_for(held.exists, "the run held at step 3", process=process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    step = int(re.search(r"SIGTERM: saved \S+ at step (\d+)", stderr).group(1))
    folder = run_dir / "checkpoints"
    assert torch.load(folder / "last.ckpt", weights_only=False)["global_step"] == step >= 3
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]  # no temporary file: every write finished


class IntervalProbe(ModelCheckpoint):
    """Test-only: ``(step, interval_due)`` at each training batch end, before ``ModelCheckpoint`` decides."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.due: list[tuple[int, bool]] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.due.append((trainer.global_step, interval_due(self, trainer)))
        super().on_train_batch_end(trainer, *args)


def fit_with(probe: IntervalProbe, steps: int) -> None:
    L.Trainer(accelerator="cpu", max_steps=steps, limit_val_batches=0, logger=False, enable_progress_bar=False,
              enable_model_summary=False, callbacks=[probe]).fit(BoringModel())  # fmt: skip


def test_the_interval_is_due_where_model_checkpoints_schedule_saves(tmp_path):
    every_two = IntervalProbe(dirpath=tmp_path, monitor=None, every_n_train_steps=2, save_top_k=-1)
    fit_with(every_two, 4)
    assert every_two.due == [(1, False), (2, True), (3, False), (4, True)]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    always = IntervalProbe(dirpath=tmp_path / "timed", monitor=None, train_time_interval=timedelta(0))
    fit_with(always, 2)
    assert always.due == [(1, True), (2, True)]  # the clock: due after every interval (here 0 s)
    hourly = IntervalProbe(dirpath=tmp_path / "hourly", monitor=None, train_time_interval=timedelta(hours=1))
    fit_with(hourly, 2)
    assert hourly.due == [(1, False), (2, False)] and not (tmp_path / "hourly").exists()
