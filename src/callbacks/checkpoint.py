"""``ModelCheckpoint`` whose ``last.ckpt`` always holds the final step of a fit."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, plus: ``last.ckpt`` is rewritten when training ends.

    Stock ``ModelCheckpoint`` only writes ``last`` at the end of training if it never wrote it before, so a run
    that stops on ``max_steps`` between two validations leaves a ``last.ckpt`` from an earlier step, and
    ``--ckpt_path=last`` would silently retrain those steps.
    """

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:
            return  # a smoke test writes no checkpoint (stock ModelCheckpoint writes last.ckpt here)
        if self.save_last and trainer.global_step > 0:
            # the private helper is ModelCheckpoint's own way of writing last (naming, links, cleanup)
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        else:
            super().on_train_end(trainer, pl_module)
