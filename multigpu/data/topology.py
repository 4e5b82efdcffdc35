"""Which data-parallel replica this process feeds, for the data side without importing the strategies."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy


def data_parallel_world(strategy: Any) -> tuple[int, int] | None:
    """``(data-parallel size, rank)`` of a model-parallel strategy, whose tensor-parallel ranks load the same
    samples; ``None`` for any other strategy."""
    if not isinstance(strategy, ModelParallelStrategy):
        return None
    kwargs = strategy.distributed_sampler_kwargs
    return int(kwargs["num_replicas"]), int(kwargs["rank"])
