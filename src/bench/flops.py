"""Training FLOPs of a workload and the device's peak, for TFLOP/s and model FLOPs utilisation (MFU)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from src.bench.workloads import build_model, tokens_per_sample

#: dense peaks (FLOP/s) of the Hopper SXM parts; Lightning's H200 entries are the sparse figures (twice these)
HOPPER_SXM_DENSE = {torch.float32: 66.9e12, "tfloat32": 494.7e12, torch.bfloat16: 989.4e12, torch.float16: 989.4e12}

#: the dtype whose peak a precision is held against
PRECISION_DTYPES = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def flops_per_sample(config: dict[str, Any]) -> float | None:
    """Forward plus backward FLOPs of one training sample.

    The language model counts itself (``flops_per_token``: 6 per parameter plus attention); other models are
    counted once by ``FlopCounterMode`` on the meta device (matrix products and convolutions only).
    """
    tokens = tokens_per_sample(config)
    if tokens is not None:
        model = build_model(config)
        if hasattr(model, "flops_per_token"):
            return float(model.flops_per_token(tokens) * tokens)
    from lightning.fabric.utilities.throughput import measure_flops

    if "CIFAR10" not in config["data"]["class_path"]:
        return None
    with torch.device("meta"):
        model = build_model(config)
        images = torch.randn(2, 3, 32, 32)
        labels = torch.zeros(2, dtype=torch.long)
    return measure_flops(model, lambda: model(images), lambda logits: F.cross_entropy(logits, labels)) / 2


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one device at this precision, where the figure comes from); None off the GPU."""
    if device.type != "cuda":
        return None, "n/a (CPU)"
    dtype: Any = PRECISION_DTYPES.get(precision, torch.float32)
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        dtype = "tfloat32"
    name = torch.cuda.get_device_name(device)
    lowered = name.lower()
    if ("h100" in lowered or "h200" in lowered) and "nvl" not in lowered and "pcie" not in lowered:
        return HOPPER_SXM_DENSE[dtype], f"{name}: dense {dtype} peak of the Hopper SXM datasheet"
    from lightning.fabric.utilities.throughput import get_available_flops

    peak = get_available_flops(device, dtype)
    return (float(peak), f"{name}: lightning get_available_flops({dtype})") if peak else (None, f"{name}: unknown")
