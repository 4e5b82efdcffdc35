"""Precision details Lightning leaves open: a "-true" precision's weights before a checkpoint is loaded, and
torchmetrics states in float64 under ``64-true`` (torchmetrics ignores ``module.double()``)."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.plugins import DoublePrecision, HalfPrecision
from torch import nn
from torchmetrics import Metric


def metrics_in_float64(module: nn.Module) -> None:
    # Metric.to: set_dtype would turn integer counts into floats too
    for metric in module.modules():
        if isinstance(metric, Metric):
            metric.to(torch.float64)


class PrecisionBeforeRestore(L.Callback):
    """Convert the module at setup under a "-true" precision: Lightning loads a checkpoint before it converts the
    module, so float64 weights would be rounded through float32 on resume."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if isinstance(trainer.precision_plugin, (DoublePrecision, HalfPrecision)):
            trainer.precision_plugin.convert_module(pl_module)


class Float64Metrics(L.Callback):
    """Metric states in float64 under ``64-true`` when each stage starts: the strategy's ``module.to(device)`` sets
    a metric's dtype back to float32."""

    def _convert(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if isinstance(trainer.precision_plugin, DoublePrecision):
            metrics_in_float64(pl_module)

    on_fit_start = on_validation_start = on_test_start = on_predict_start = _convert  # type: ignore[assignment]
