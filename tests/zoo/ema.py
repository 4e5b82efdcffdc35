"""A student with an exponential-moving-average teacher copy of its network (BYOL / mean-teacher style)."""

from __future__ import annotations

import copy

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


class EMATeacher(L.LightningModule):
    """Trains ``student``; ``teacher`` follows it by EMA after every step and is what validation scores."""

    def __init__(self, hidden: int = 16, lr: float = 0.02, decay: float = 0.9) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.student = nn.Sequential(nn.Linear(4, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.teacher = copy.deepcopy(self.student).requires_grad_(False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x.to(self.dtype) / 255
        with torch.no_grad():
            target = 0.5 * y.to(self.dtype) + 0.5 * self.teacher(x)  # the teacher softens the target
        loss = F.mse_loss(self.student(x), target)
        self.log("loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        with torch.no_grad():
            for t, s in zip(self.teacher.parameters(), self.student.parameters(), strict=True):
                t.lerp_(s, 1 - self.hparams.decay)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("teacher_mse", F.mse_loss(self.teacher(x.to(self.dtype) / 255), y.to(self.dtype)), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.student.parameters(), lr=self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5)}
