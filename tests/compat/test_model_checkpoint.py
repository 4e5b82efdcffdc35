"""``multigpu/compat/model_checkpoint.py``, proven on a real ``ModelCheckpoint`` in real fits: the metrics it decides
on, its schedule and clock, its record of the files it wrote, and the protected hooks ``RunCheckpoint`` overrides."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel

from multigpu import compat
from tests.compat.conftest import BATCHES, Hooks, trainer
from tests.fixtures.workload import TinyClassifier


class LoggedModel(BoringModel):
    """BoringModel that logs ``val/loss``."""

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        output = super().validation_step(batch, batch_idx)
        self.log("val/loss", output["x"])
        return output


class RecordingCheckpoint(ModelCheckpoint):
    """Test-only: records each call of the two protected hooks ``RunCheckpoint`` overrides. A monitored metric that
    is missing stops in the top-k hook when ``missing`` says so: ``skip`` (nothing saved), or ``write_last``
    (``last.ckpt`` written there, as ``RunCheckpoint`` writes it)."""

    def __init__(self, *args: Any, missing: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.missing = missing
        self.calls: list[tuple[str, int, set[str]]] = []

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        self.calls.append(("topk", trainer.global_step, set(monitor_candidates)))
        if self.missing is not None and self.monitor not in monitor_candidates:
            if self.missing == "write_last":
                compat.save_last_checkpoint(self, trainer, monitor_candidates)
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        self.calls.append(("last", trainer.global_step, set(monitor_candidates)))
        super()._save_last_checkpoint(trainer, monitor_candidates)


def checkpointed_fit(tmp_path: Path, monitor: str, **kwargs: Any) -> tuple[L.Trainer, RecordingCheckpoint]:
    """A fit of 4 steps that validates after steps 2 and 4, checkpointed by a ``RecordingCheckpoint``."""
    checkpoint = RecordingCheckpoint(dirpath=tmp_path, monitor=monitor, save_last=True, **kwargs)
    fit = trainer(max_steps=BATCHES, limit_val_batches=1, val_check_interval=2, enable_checkpointing=True,
                  callbacks=[checkpoint])  # fmt: skip
    fit.fit(LoggedModel())
    return fit, checkpoint


def hook_calls(checkpoint: RecordingCheckpoint) -> list[tuple[str, int]]:
    return [(name, step) for name, step, _ in checkpoint.calls]


def test_model_checkpoint_runs_the_topk_hook_at_every_validation_and_the_last_hook_after_a_save(tmp_path):
    _, checkpoint = checkpointed_fit(tmp_path, monitor="val/loss", save_top_k=-1)
    assert hook_calls(checkpoint) == [("topk", 2), ("last", 2), ("topk", 4), ("last", 4)]
    assert all({"val/loss", "epoch", "step"} <= names for _, _, names in checkpoint.calls)
    assert (tmp_path / "last.ckpt").is_file() and checkpoint.best_model_path


def test_a_monitored_metric_the_model_does_not_log_still_reaches_the_topk_hook(tmp_path):
    """``RunCheckpoint`` reports the missing metric there (Lightning must not raise before it) and writes
    ``last.ckpt`` there: without it nothing is written before training ends, and with it Lightning calls the last
    hook right after, which ``RunCheckpoint``'s override of that hook skips."""
    _, skipped = checkpointed_fit(tmp_path / "skip", monitor="val/missing", missing="skip")
    assert hook_calls(skipped) == [("topk", 2), ("topk", 4), ("last", 4)]  # last.ckpt only at the end
    assert all("val/missing" not in names for _, _, names in skipped.calls)
    _, written = checkpointed_fit(tmp_path / "written", monitor="val/missing", missing="write_last")
    assert hook_calls(written) == [("topk", 2), ("last", 2), ("last", 2), ("topk", 4), ("last", 4), ("last", 4)]
    with pytest.raises(Exception, match="val/missing"):  # what the override of the top-k hook prevents
        checkpointed_fit(tmp_path / "stock", monitor="val/missing")


def test_monitor_candidates_and_save_last_checkpoint_write_last_as_model_checkpoint_does(tmp_path):
    fit, checkpoint = checkpointed_fit(tmp_path, monitor="val/loss", save_top_k=-1)
    candidates = compat.monitor_candidates(checkpoint, fit)
    assert {"val/loss", "epoch", "step"} <= set(candidates) and int(candidates["step"]) == BATCHES
    (tmp_path / "last.ckpt").unlink()
    checkpoint.calls.clear()
    compat.save_last_checkpoint(checkpoint, fit, candidates)
    assert [name for name, _, _ in checkpoint.calls] == ["last"]  # through a subclass's override
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == BATCHES


class ScheduleProbe(ModelCheckpoint):
    """Test-only: at each training batch end, whether ModelCheckpoint saves nothing whatever its schedule, and each
    file its one writing hook ``_save_checkpoint`` (which ``RunCheckpoint`` overrides) is called for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.not_due: list[tuple[int, bool]] = []
        self.written: list[tuple[int, str]] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.not_due.append((trainer.global_step, compat.checkpoint_not_due(self, trainer)))
        super().on_train_batch_end(trainer, *args)

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        self.written.append(compat.last_checkpoint_written(self))


def test_the_schedule_and_the_record_of_written_files_are_model_checkpoints(tmp_path):
    """Every 2 steps with no monitor: each save (steps 2 and 4) passes through ``_save_checkpoint``, which records
    the step and file; the record can be set, as a link of a file sets it."""
    probe = ScheduleProbe(dirpath=tmp_path, monitor=None, every_n_train_steps=2, save_last=True, save_top_k=1)
    fit = trainer(max_steps=BATCHES, enable_checkpointing=True, callbacks=[probe])
    fit.fit(BoringModel())
    assert probe.not_due == [(1, False), (2, False), (3, False), (4, False)]  # while fitting, the schedule decides
    assert [(step, Path(path).name) for step, path in probe.written] == [
        (2, "epoch=0-step=2.ckpt"), (2, "last.ckpt"), (4, "epoch=0-step=4.ckpt"), (4, "last.ckpt")
    ]  # fmt: skip
    assert compat.checkpoint_not_due(probe, fit)  # not fitting any more
    compat.record_checkpoint_written(probe, fit, str(tmp_path / "other.ckpt"))
    assert compat.last_checkpoint_written(probe) == (BATCHES, str(tmp_path / "other.ckpt"))
    assert compat.versions_checkpoint_names(probe) and not compat.versions_checkpoint_names(
        ModelCheckpoint(enable_version_counter=False)
    )


def test_the_schedule_and_the_clock_of_its_interval_are_the_ones_model_checkpoint_decides_on(tmp_path):
    """The clock read is the one ``ModelCheckpoint`` restarts when its interval falls due, and a clock set back two
    hours makes its hourly interval due at the next batch end."""
    assert compat.checkpoint_schedule(ModelCheckpoint(every_n_train_steps=3)) == (3, None)
    hourly = ModelCheckpoint(dirpath=tmp_path, monitor=None, train_time_interval=timedelta(hours=1))
    assert compat.checkpoint_schedule(hourly) == (0, timedelta(hours=1)) and compat.interval_clock(hourly) is None
    clocks: list[float | None] = []

    def at_batch_end(t: L.Trainer, index: int) -> None:  # runs before ModelCheckpoint's, which Lightning puts last
        clocks.append(compat.interval_clock(hourly))
        if index == 1:
            compat.restart_interval_clock(hourly, time.monotonic() - 7200)

    trainer(max_steps=3, enable_checkpointing=True, callbacks=[Hooks(on_train_batch_end=at_batch_end), hourly]).fit(
        BoringModel()
    )
    assert [path.name for path in tmp_path.iterdir()] == ["epoch=0-step=2.ckpt"]  # due once, after the set-back
    assert isinstance(clocks[0], float) and clocks[0] == clocks[1] < clocks[2]  # restarted when it saved


def test_trained_class_path_is_the_class_lightning_cli_built_the_model_as():
    model_path = f"{TinyClassifier.__module__}.{TinyClassifier.__qualname__}"
    cli = LightningCLI(L.LightningModule, subclass_mode_model=True, run=False, args=[f"--model={model_path}",
                       "--trainer.logger=false", "--trainer.enable_checkpointing=false"])  # fmt: skip
    assert compat.trained_class_path(dict(cli.model.hparams)) == model_path
    assert compat.trained_class_path(dict(TinyClassifier().hparams)) is None  # built without LightningCLI
