"""Precision details Lightning leaves open: a "-true" precision's weights before a checkpoint is loaded, and
torchmetrics states in float64 under ``--trainer.precision=64-true``.

torchmetrics ignores ``module.double()`` (Lightning's ``64-true``), so a mean's last digits would depend on how the
batches are split between processes, which a float64 run is meant to rule out.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.plugins import DoublePrecision, HalfPrecision
from torch import nn
from torchmetrics import Metric


def metrics_in_float64(module: nn.Module) -> None:
    """Put the floating-point states of every torchmetrics metric in ``module`` in float64 with ``Metric.to``
    (``set_dtype`` would turn integer counts into floats too)."""
    for metric in module.modules():
        if isinstance(metric, Metric):
            metric.to(torch.float64)


class PrecisionBeforeRestore(L.Callback):
    """Under a "-true" precision (``64-true``, ``bf16-true``, ``16-true``), convert the module at setup: Lightning
    loads a checkpoint's weights before it converts the module, so float64 weights would be rounded through
    float32 on resume (Lightning's own conversion later is then a no-op)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if isinstance(trainer.precision_plugin, (DoublePrecision, HalfPrecision)):
            trainer.precision_plugin.convert_module(pl_module)


class Float64Metrics(L.Callback):
    """Under ``64-true``, calls ``metrics_in_float64`` when each stage starts: every ``module.to(device)`` that
    comes earlier (the strategy's setup) sets a metric's input dtype back to float32, though it leaves its states
    in float64."""

    def _convert(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if isinstance(trainer.precision_plugin, DoublePrecision):
            metrics_in_float64(pl_module)

    on_fit_start = on_validation_start = on_test_start = on_predict_start = _convert  # type: ignore[assignment]
