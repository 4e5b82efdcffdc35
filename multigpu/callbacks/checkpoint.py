"""``ModelCheckpoint`` that works with any model: ``last.ckpt`` always holds the final step of a fit, and a
monitored metric the model does not log is reported once instead of stopping the run."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from multigpu import compat
from multigpu.callbacks.continuation import epoch_interrupted


def missing_monitor_message(monitor: str, logged: list[str], from_validation: list[str]) -> str:
    """The one-paragraph warning for a ``--checkpoint.monitor`` that the model never logs."""
    shown = ", ".join(logged) if logged else "none"
    example = (from_validation or logged or ["<your metric>"])[0]
    return (
        f"--checkpoint.monitor={monitor} is not logged by this model (logged metrics: {shown}), so no best-*.ckpt"
        f" is kept; last.ckpt is still written at every validation and at the end of training."
        f" Fix: pass --checkpoint.monitor={example} (and --checkpoint.mode=min or max), or log {monitor!r}"
        " with self.log in your validation step."
    )


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, plus two things any user's model needs.

    - ``last.ckpt`` is rewritten when training ends (stock ``ModelCheckpoint`` keeps one from an earlier step if it
      wrote one), and nothing is decided at the epoch end Lightning adds to a mid-epoch stop.
    - A ``monitor`` that the model does not log gives one warning naming the logged metrics, instead of an error.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._missing_monitor_reported = False
        self._logged_before_validation: set[str] = set()
        self._validated = False  # a validation ran (not the sanity check): its metrics are known
        self._last_just_saved = False  # the top-k step wrote last.ckpt for a missing monitor (see below)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:
            return  # a smoke test writes no checkpoint (stock ModelCheckpoint writes last.ckpt here)
        if self.save_last and trainer.global_step > 0:
            # ModelCheckpoint's own way of writing last (naming, links, cleanup)
            compat.save_last_checkpoint(self, trainer, compat.monitor_candidates(self, trainer))
        else:
            super().on_train_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if epoch_interrupted(trainer):
            return  # Lightning ends a max_steps / max_time stop with an epoch end that an uninterrupted run lacks
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # what validation adds to these is what the warning suggests monitoring
        self._logged_before_validation = set(trainer.callback_metrics)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validated = self._validated or not trainer.sanity_checking
        super().on_validation_end(trainer, pl_module)

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        # ModelCheckpoint's one place that decides on the monitored metric (a protected hook, multigpu.compat's
        # OVERRIDDEN_HOOKS): skip the best-k when the metric is absent, say so once
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
                # Lightning writes last.ckpt only at a step the top-k just saved: without the metric it saved
                # nothing, so a crash would lose the whole run. Write it here; the call that follows repeats it.
                compat.save_last_checkpoint(self, trainer, monitor_candidates)
                self._last_just_saved = True
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        # ModelCheckpoint calls it right after _save_topk_checkpoint at every save point (protected, like that one)
        if self._last_just_saved:
            self._last_just_saved = False
            return
        super()._save_last_checkpoint(trainer, monitor_candidates)
