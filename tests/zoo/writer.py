"""Writes predictions with Lightning's ``BasePredictionWriter``: one file per data-parallel replica in
``output_dir`` (per process under ddp; once per pipeline or tensor-parallel group, ``prediction_replica``)."""

from __future__ import annotations

import os

import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from multigpu.strategies import prediction_replica


class SavePredictions(BasePredictionWriter):
    def __init__(self, output_dir: str) -> None:
        super().__init__(write_interval="epoch")
        self.output_dir = output_dir

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        replica = prediction_replica(trainer)
        if replica is None:
            return  # another process of this replica writes the same predictions
        os.makedirs(self.output_dir, exist_ok=True)
        path = os.path.join(self.output_dir, f"predictions_rank{replica}.pt")
        torch.save({"predictions": predictions, "batch_indices": batch_indices}, path)
