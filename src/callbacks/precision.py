"""Under ``--trainer.precision=64-true``, torchmetrics metrics sum in float64 too.

torchmetrics ignores ``module.double()`` (Lightning's ``64-true``), so a mean's last digits would depend on how the
batches are split between processes, which a float64 run is meant to rule out.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torchmetrics import Metric


def metrics_in_float64(module: nn.Module) -> None:
    """Put the floating-point states of every torchmetrics metric in ``module`` in float64 with ``Metric.to``
    (``set_dtype`` would turn integer counts into floats too)."""
    for metric in module.modules():
        if isinstance(metric, Metric):
            metric.to(torch.float64)


class Float64Metrics(L.Callback):
    """Calls ``metrics_in_float64`` when each stage starts: every ``module.to(device)`` that comes earlier (the
    strategy's setup) sets a metric's input dtype back to float32, though it leaves its states in float64."""

    def _convert(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics_in_float64(pl_module)

    on_fit_start = on_validation_start = on_test_start = on_predict_start = _convert  # type: ignore[assignment]
