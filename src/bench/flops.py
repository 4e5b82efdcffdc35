"""Training FLOPs of a workload and the device's peak, for TFLOP/s and model FLOPs utilisation (MFU).

Both come from the places every training run uses: the models' own ``flops_per_sample`` and the dense peak
table of ``src/callbacks/throughput.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from src.callbacks.throughput import compute_kind, dense_peak_flops


def flops_per_sample(model: Any, tokens: int | None) -> float | None:
    """Forward plus backward FLOPs of one training sample, as the model counts them (``flops_per_sample``).

    The language model counts 6 per parameter plus attention per token; the image classifier counts its matrix
    products and convolutions once with ``FlopCounterMode`` on the meta device.
    """
    if not hasattr(model, "flops_per_sample"):
        return None
    return float(model.flops_per_sample(tokens) if tokens is not None else model.flops_per_sample())


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one device at this precision, where the figure comes from); None off the GPU."""
    if device.type != "cuda":
        return None, "n/a (CPU)"
    name = torch.cuda.get_device_name(device)
    peak = dense_peak_flops(device, precision)
    return (
        (peak, f"{name}: dense {compute_kind(precision)} peak (src/callbacks/throughput.py)")
        if peak
        else (None, f"{name}: unknown")
    )
