"""Stop training at a NaN or infinite loss, before the bad weights reach a checkpoint. The first non-finite step is
recorded on the device and read only when the logger waits anyway, or before a checkpoint is written."""

from __future__ import annotations

import math
import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from multigpu.errors import TrainingStopped
from multigpu.steps import EveryNSteps


class NonFiniteLoss(TrainingStopped):
    """Training stopped because the loss became NaN or infinite; the last good checkpoint was left intact."""

    exit_code = 65  # EX_DATAERR, not a preemption's 75: a scheduler must not requeue a run that would diverge again
    label = "error"


def last_good_checkpoint(trainer: L.Trainer) -> str | None:
    paths = []
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            paths += [callback.last_model_path, callback.best_model_path]
    existing = [p for p in paths if p and os.path.isfile(p)]
    if existing:
        return max(existing, key=os.path.getmtime)
    return str(trainer.ckpt_path) if trainer.ckpt_path else None


class NonFiniteLossGuard(Callback):
    """Raises ``NonFiniteLoss`` naming the first step whose training loss was NaN or infinite.

    Args:
        check_every_n_steps: Optimizer steps between reads of the device-side record; 0 picks 1 on a CPU and
            ``log_every_n_steps`` on an accelerator or under several processes. A checkpoint save always reads it
            first.
    """

    def __init__(self, check_every_n_steps: int = 0) -> None:
        super().__init__()
        self.check_every_n_steps = check_every_n_steps
        self._first_bad: torch.Tensor | None = None  # -1 if none
        self._every = EveryNSteps()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        one_cpu_process = trainer.strategy.root_device.type == "cpu" and trainer.world_size == 1
        every = self.check_every_n_steps or (1 if one_cpu_process else max(1, trainer.log_every_n_steps))
        self._every = EveryNSteps(every, start=trainer.global_step)
        self._first_bad = torch.full((), -1, dtype=torch.long, device=trainer.strategy.root_device)

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self._first_bad is None:
            return
        if self._every.n == 1 and trainer.world_size == 1 and loss.device.type == "cpu" and loss.numel() == 1:
            # one CPU process reads every step: a Python float is ten times cheaper than the tensor ops below
            if not math.isfinite(loss.item()):
                self._first_bad.fill_(trainer.global_step + 1)
                self._check(trainer)
            return
        bad = ~torch.isfinite(loss.detach()).all()
        self._first_bad = torch.where(bad & (self._first_bad < 0), trainer.global_step + 1, self._first_bad)
        if self._every.n == 1 and trainer.world_size == 1:
            self._check(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._first_bad is not None and self._every.due(trainer.global_step):
            self._check(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # called while the checkpoint is assembled, before any file is written: raising here keeps the old one
        if self._first_bad is not None:
            self._check(trainer)

    def _check(self, trainer: L.Trainer) -> None:
        assert self._first_bad is not None
        first_bad = self._first_bad
        if trainer.world_size > 1:
            # the earliest of any rank: a NaN on one rank reaches the others a step later through the all-reduce
            none = torch.iinfo(first_bad.dtype).max
            first_bad = trainer.strategy.reduce(torch.where(first_bad < 0, none, first_bad), reduce_op="min")
            first_bad = torch.where(first_bad == none, -1, first_bad)
        step = int(first_bad)
        if step < 0:
            return
        checkpoint = last_good_checkpoint(trainer)
        kept = f"the last good checkpoint, {checkpoint}, is unchanged" if checkpoint else "no checkpoint was saved"
        raise NonFiniteLoss(
            f"the training loss was NaN or infinite at optimizer step {step} (counting from 1); training stopped"
            f" after {trainer.global_step} applied steps and {kept}. Fix: lower the learning rate"
            " (--model.init_args.optimizer.init_args.lr), set --trainer.gradient_clip_val, or use"
            " --trainer.precision=bf16-mixed instead of 16-mixed; then resume with --ckpt_path=<that checkpoint>."
        )
