"""Precision details Lightning leaves open (multigpu/strategies/precision.py): metric states in float64 under
``64-true``."""

from __future__ import annotations

import torch

from multigpu.strategies.precision import metrics_in_float64
from tests.faults.test_ranks import TwoMetrics


def test_64_true_keeps_floating_metric_states_in_float64_and_counts_as_integers():
    module = TwoMetrics()
    module.double()  # what --trainer.precision=64-true does to the model: torchmetrics ignores it
    assert module.mean.mean_value.dtype == torch.float32
    metrics_in_float64(module)
    assert module.mean.mean_value.dtype == module.mean.weight.dtype == torch.float64
    assert module.acc.tp.dtype == torch.int64
    module.to("cpu")  # what a strategy's setup does: torchmetrics sets the dtype it casts inputs to back to float32
    assert module.mean.dtype == torch.float32 and module.mean.mean_value.dtype == torch.float64
    metrics_in_float64(module)  # hence Float64Metrics calls it again when each stage starts
    assert module.mean.dtype == torch.float64
    module.mean.update(torch.tensor([1.0, 2.0], dtype=torch.float64))
    module.mean.reset()  # reset() restores defaults that are float64 too
    assert module.mean.mean_value.dtype == torch.float64
