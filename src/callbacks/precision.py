"""Under ``--trainer.precision=64-true``, torchmetrics metrics sum in float64 too.

torchmetrics ignores ``module.double()``, which is how Lightning converts the model to ``64-true``, so a loss mean
would still be summed in float32 (and many metrics cast every input to their float32 ``dtype`` first): its last
digits would then depend on how the batches are split between processes, which a float64 run is meant to rule out.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torchmetrics import Metric


def metrics_in_float64(module: nn.Module) -> None:
    """Put the floating-point states of every torchmetrics metric in ``module`` (and the values ``reset()``
    restores, and the dtype it casts inputs to) in float64; integer states such as counts stay integers.

    ``Metric.to(torch.float64)`` does exactly that, while ``set_dtype`` would turn integer counts into floats.
    """
    for metric in module.modules():
        if isinstance(metric, Metric):
            metric.to(torch.float64)


class Float64Metrics(L.Callback):
    """Calls ``metrics_in_float64`` when each stage starts: every ``module.to(device)`` that comes earlier (the
    strategy's setup) sets a metric's input dtype back to float32, though it leaves its states in float64."""

    def _convert(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics_in_float64(pl_module)

    on_fit_start = on_validation_start = on_test_start = on_predict_start = _convert  # type: ignore[assignment]
