"""The engine's reads of the hooks of ``hooks.py``, each through its Protocol: an undeclared hook is never read."""

from __future__ import annotations

from typing import Any

from multigpu.hooks import (
    FLOPS_HOOKS,
    PIPELINE_HOOKS,
    ChecksItsData,
    CountsFlops,
    CountsFlopsPerBatch,
    Pipelined,
    StageWithLayers,
)

FLOPS_PROTOCOLS = dict(zip(FLOPS_HOOKS, (CountsFlopsPerBatch, CountsFlops), strict=True))


def module_flops(module: Any) -> tuple[str, float] | None:
    """(the FLOPs hook's name, its value) of ``module``, or None if it declares neither."""
    for name, protocol in FLOPS_PROTOCOLS.items():
        if not isinstance(module, protocol):
            continue
        value = getattr(module, name)
        if callable(value):
            value = value()
        if value:
            return name, float(value)
    return None


def missing_pipeline_hooks(model: Any) -> list[str]:
    if isinstance(model, Pipelined) and all(callable(getattr(model, name)) for name in PIPELINE_HOOKS):
        return []
    return [name for name in PIPELINE_HOOKS if not callable(getattr(model, name, None))]


def stage_layer_count(stage: Any) -> int | None:
    return len(stage.layers()) if isinstance(stage, StageWithLayers) and callable(stage.layers) else None


def check_datamodule(model: Any, datamodule: Any) -> None:
    if isinstance(model, ChecksItsData) and callable(model.check_datamodule) and datamodule is not None:
        model.check_datamodule(datamodule)
