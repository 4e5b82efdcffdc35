"""The global batch one device's micro-batch gives, and the learning rate carried to it (multigpu/tuning/scaling.py)."""

from __future__ import annotations

import math

import pytest

from multigpu.data.sampling import per_process_batch_size
from multigpu.tuning import global_batch_size, scaled_lr


def test_the_global_batch_divides_and_the_learning_rate_scales_by_the_chosen_rule():
    for devices, accumulate in [(1, 1), (2, 1), (4, 2), (3, 5)]:
        batch = global_batch_size(16, devices, accumulate)
        assert per_process_batch_size(batch, devices, accumulate) == 16
    assert scaled_lr(1e-3, 16, 64, "linear") == pytest.approx(4e-3)
    assert scaled_lr(1e-3, 16, 64, "sqrt") == pytest.approx(2e-3)
    assert scaled_lr(1e-3, 16, 64, "none") == 1e-3
    assert math.isclose(scaled_lr(2e-3, 64, 16, "sqrt"), 1e-3)
