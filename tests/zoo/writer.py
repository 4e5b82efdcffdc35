"""Writes predictions with Lightning's ``BasePredictionWriter``: one file per process in ``output_dir``."""

from __future__ import annotations

import os

import torch
from lightning.pytorch.callbacks import BasePredictionWriter


class SavePredictions(BasePredictionWriter):
    def __init__(self, output_dir: str) -> None:
        super().__init__(write_interval="epoch")
        self.output_dir = output_dir

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        os.makedirs(self.output_dir, exist_ok=True)
        path = os.path.join(self.output_dir, f"predictions_rank{trainer.global_rank}.pt")
        torch.save({"predictions": predictions, "batch_indices": batch_indices}, path)
