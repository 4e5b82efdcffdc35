"""``ModelCheckpoint`` that works with any model: ``last.ckpt`` at every interval and at a fit's end, one file under
both names where best and last are one save, and a monitored metric the model does not log reported once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from weakref import proxy

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from multigpu import compat
from multigpu.checkpoints.background import BackgroundCheckpointIO, wait_for_checkpoints
from multigpu.checkpoints.continuation import epoch_interrupted
from multigpu.checkpoints.files import AtomicCheckpointIO, link_checkpoint


def missing_monitor_message(monitor: str, logged: list[str], from_validation: list[str]) -> str:
    shown = ", ".join(logged) if logged else "none"
    example = (from_validation or logged or ["<your metric>"])[0]
    return (
        f"--checkpoint.monitor={monitor} is not logged by this model (logged metrics: {shown}), so no best-*.ckpt"
        f" is kept; last.ckpt is still written at every validation, at every interval of"
        " --checkpoint.every_n_train_steps / train_time_interval and at the end of training."
        f" Fix: pass --checkpoint.monitor={example} (and --checkpoint.mode=min or max), or log {monitor!r}"
        " with self.log in your validation step."
    )


def interval_due(checkpoint: ModelCheckpoint, trainer: L.Trainer) -> bool:
    """Whether the schedule falls on the batch that just ended, as ``ModelCheckpoint.on_train_batch_end`` decides."""
    every, interval = compat.checkpoint_schedule(checkpoint)
    due = every >= 1 and trainer.global_step % every == 0
    if interval is not None:
        now, previous = time.monotonic(), compat.interval_clock(checkpoint)
        not_yet = previous is None or now - previous < interval.total_seconds()
        if not trainer.strategy.broadcast(not_yet):  # the ranks' clocks differ: rank 0's decides
            compat.restart_interval_clock(checkpoint, now)
            due = True
    return due


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, plus what any user's model needs.

    Args:
        async_save: Write each checkpoint (sharded ones too) in the background while training goes on, at the cost
            of a copy of the state in host memory. ``false``: every save is written before training continues.
    """

    def __init__(self, *args: Any, async_save: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.async_save = async_save
        self._link_source: str | None = None  # the top-k file of this save, which last.ckpt may name
        self._save_after_validation = False
        self._missing_monitor_reported = False
        self._logged_before_validation: set[str] = set()
        self._validated = False  # not the sanity check
        self._last_just_saved = False

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:
            return  # a smoke test writes no checkpoint (stock ModelCheckpoint writes last.ckpt here)
        if self.save_last and trainer.global_step > 0:
            compat.save_last_checkpoint(self, trainer, compat.monitor_candidates(self, trainer))
        else:
            super().on_train_end(trainer, pl_module)
        wait_for_checkpoints(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # replaces ModelCheckpoint's, which saves nothing (not even last.ckpt) while the monitored metric is absent
        if not interval_due(self, trainer) or compat.checkpoint_not_due(self, trainer):
            return
        if compat.validation_follows(trainer):
            # saved once that validation is done: its metric decides the top-k, and the resumed run does not skip it
            self._save_after_validation = True
            return
        candidates = compat.monitor_candidates(self, trainer)
        if self.monitor is not None and self.monitor not in candidates:
            self._save_after_validation = True  # the top-k waits for the metric; last.ckpt is written now
        self._save_pair(trainer)

    def _save_pair(self, trainer: L.Trainer) -> None:
        candidates = compat.monitor_candidates(self, trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if epoch_interrupted(trainer):
            return  # Lightning ends a max_steps / max_time stop with an epoch end that an uninterrupted run lacks
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._logged_before_validation = set(trainer.callback_metrics)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validated = self._validated or not trainer.sanity_checking
        if self._save_after_validation and not compat.checkpoint_not_due(self, trainer):
            self._save_after_validation = False
            self._save_pair(trainer)
        super().on_validation_end(trainer, pl_module)

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        # protected: compat's OVERRIDDEN_HOOKS
        self._link_source = None
        last = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
        # the state the top-k file holds names last.ckpt as the last checkpoint, so it can be last.ckpt's second name
        linkable = self.save_last and self.last_model_path in ("", last) and self._can_link(trainer)
        if linkable:
            self.last_model_path = last
        before = compat.last_checkpoint_written(self)
        self._save_topk_or_report(trainer, monitor_candidates)
        written = compat.last_checkpoint_written(self)
        if linkable and written != before and written[0] == trainer.global_step and written[1] != last:
            self._link_source = written[1]

    def _save_topk_or_report(self, trainer: L.Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        if self.monitor is not None and self.save_top_k != 0 and self.monitor not in monitor_candidates:
            # before the first validation a validation metric is missing because it was not computed yet
            module = trainer.lightning_module
            validates = trainer.limit_val_batches != 0 and compat.overrides_hook(module, "validation_step")
            if not self._missing_monitor_reported and (self._validated or not validates):
                self._missing_monitor_reported = True
                logged = sorted(name for name in monitor_candidates if name not in ("epoch", "step"))
                from_validation = [name for name in logged if name not in self._logged_before_validation]
                rank_zero_warn(missing_monitor_message(self.monitor, logged, from_validation))
            if self.save_last:
                # Lightning writes last.ckpt only at a step the top-k saved: without the metric a crash loses the run
                compat.save_last_checkpoint(self, trainer, monitor_candidates)
                self._last_just_saved = True
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        if self._last_just_saved:
            self._last_just_saved = False
            return
        try:
            super()._save_last_checkpoint(trainer, monitor_candidates)
        finally:
            self._link_source = None  # a later save of this step (the end of training) holds another state

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        source = self._link_source
        if source is None or Path(source).name == Path(filepath).name:
            super()._save_checkpoint(trainer, filepath)
            return
        self._link_source = None
        if trainer.is_global_zero:
            io = trainer.strategy.checkpoint_io
            if isinstance(io, BackgroundCheckpointIO):
                io.link_checkpoint(source, filepath)
            else:
                link_checkpoint(source, filepath)
        trainer.strategy.barrier("RunCheckpoint.link")
        compat.record_checkpoint_written(self, trainer, filepath)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    def _can_link(self, trainer: L.Trainer) -> bool:
        # atomic saves replace a file, never change it, so the other name keeps its bytes
        atomic = isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
        return atomic and "://" not in str(self.dirpath) and not compat.versions_checkpoint_names(self)
