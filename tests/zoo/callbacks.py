"""Callbacks the zoo tests add on the command line."""

from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import Callback


class RecordSeed(Callback):
    """Appends ``rank seed`` to ``path`` on every rank when fitting starts."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        with open(self.path, "a") as handle:
            handle.write(f"{trainer.global_rank} {os.environ.get('PL_GLOBAL_SEED')}\n")
