"""The model summary at the start of fit (multigpu/observe/summary.py): FLOPs counted on an example input are shown;
without one, the FLOPs the model declares take the place of Lightning's column of zeros."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from multigpu.observe.summary import ModelSummary
from tests.fixtures.workload import TinyClassifier, TinyData


class DeclaresBatchFlops(TinyClassifier):
    flops_per_batch = 3.0e9  # read before flops_per_sample


def summary_of(model: L.LightningModule, capsys: pytest.CaptureFixture) -> tuple[str, str]:
    """(the table's header line, everything printed) of a one-step fit."""
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, limit_val_batches=0, callbacks=[ModelSummary()], logger=False,
        enable_checkpointing=False, enable_progress_bar=False,
    )  # fmt: skip
    trainer.fit(model, datamodule=TinyData())
    printed = capsys.readouterr().out
    return next(line for line in printed.splitlines() if "┃ Name" in line), printed


def test_flops_counted_on_an_example_input_are_shown(capsys):
    model = TinyClassifier()
    model.example_input_array = torch.zeros(2, 16)
    header, printed = summary_of(model, capsys)
    assert "FLOPs" in header
    assert "Total FLOPs: 2.6 K" in printed  # 2 samples x 2 x (16 x 32 + 32 x 4) multiply-adds
    assert "Training FLOPs" not in printed


def test_without_an_example_input_the_declared_flops_replace_the_column_of_zeros(capsys):
    header, printed = summary_of(DeclaresBatchFlops(), capsys)
    assert "FLOPs" not in header and "Total FLOPs" not in printed
    assert "Training FLOPs per micro-batch (the model's flops_per_batch): 3.0 B" in printed
