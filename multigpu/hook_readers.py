"""The engine's reads of what a model or data module may implement (``multigpu/hooks.py``): each through the hook's
Protocol, so that a hook the Protocols do not declare is not read. The features that read them (the throughput
callback, the model summary, the pipeline strategy, the checks of the built objects) call these."""

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

#: each FLOPs hook's Protocol, in the order ``FLOPS_HOOKS`` reads them
FLOPS_PROTOCOLS = dict(zip(FLOPS_HOOKS, (CountsFlopsPerBatch, CountsFlops), strict=True))


def module_flops(module: Any) -> tuple[str, float] | None:
    """(``flops_per_batch`` or ``flops_per_sample``, its value) of ``module``, or None if it declares neither."""
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
    """The methods of ``Pipelined`` that ``model`` (a model or its class) lacks."""
    if isinstance(model, Pipelined) and all(callable(getattr(model, name)) for name in PIPELINE_HOOKS):
        return []
    return [name for name in PIPELINE_HOOKS if not callable(getattr(model, name, None))]


def stage_layer_count(stage: Any) -> int | None:
    """How many blocks a pipeline stage runs, where it says (``StageWithLayers``)."""
    return len(stage.layers()) if isinstance(stage, StageWithLayers) and callable(stage.layers) else None


def check_datamodule(model: Any, datamodule: Any) -> None:
    """The model's own check of the data module it is paired with (``ChecksItsData``), where it has one."""
    if isinstance(model, ChecksItsData) and callable(model.check_datamodule) and datamodule is not None:
        model.check_datamodule(datamodule)
