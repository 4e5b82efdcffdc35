"""The global batch and learning rate of the run asked for, from what one device holds."""

from __future__ import annotations

import math
from typing import Literal

LrScaling = Literal["sqrt", "linear", "none"]


def global_batch_size(micro_batch: int, devices: int, accumulate_grad_batches: int = 1) -> int:
    """The global ``--data.batch_size`` at which every device loads ``micro_batch`` samples per micro-batch."""
    if micro_batch < 1 or devices < 1 or accumulate_grad_batches < 1:
        raise ValueError(f"need positive sizes, got {micro_batch=}, {devices=}, {accumulate_grad_batches=}")
    return micro_batch * devices * accumulate_grad_batches


def scaled_lr(lr: float, measured_batch: int, target_batch: int, rule: LrScaling) -> float:
    """``lr`` found at ``measured_batch``, carried to ``target_batch``: ``linear`` by the batch ratio (SGD), ``sqrt`` by
    its root (Adam-type: gradient noise scales with 1/sqrt(batch))."""
    ratio = target_batch / measured_batch
    factor = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]
    return lr * factor
