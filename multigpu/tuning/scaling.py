"""From what one device can hold to the run that was asked for: the global batch and the learning rate."""

from __future__ import annotations

import math
from typing import Literal

LrScaling = Literal["sqrt", "linear", "none"]


def global_batch_size(micro_batch: int, devices: int, accumulate_grad_batches: int = 1) -> int:
    """The ``--data.batch_size`` (global) at which every device loads ``micro_batch`` samples per micro-batch.

    It is a multiple of ``devices x accumulate_grad_batches`` by construction, so it divides the way
    ``per_process_batch_size`` requires.

    >>> global_batch_size(16, devices=4, accumulate_grad_batches=2)
    128
    """
    if micro_batch < 1 or devices < 1 or accumulate_grad_batches < 1:
        raise ValueError(f"need positive sizes, got {micro_batch=}, {devices=}, {accumulate_grad_batches=}")
    return micro_batch * devices * accumulate_grad_batches


def scaled_lr(lr: float, measured_batch: int, target_batch: int, rule: LrScaling) -> float:
    """``lr`` found at ``measured_batch``, carried over to ``target_batch``.

    ``linear`` multiplies by the batch ratio (Goyal et al. 2017, for SGD with momentum); ``sqrt`` by its
    square root (the gradient noise scales with 1/sqrt(batch), the usual rule for Adam-type optimizers);
    ``none`` keeps it.

    >>> scaled_lr(1e-3, measured_batch=32, target_batch=128, rule="sqrt")
    0.002
    """
    ratio = target_batch / measured_batch
    factor = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]
    return lr * factor
