"""Where this process stands in the run's parallelism, for the data side: which data-parallel replica it feeds.

A module of its own so that a data module can ask without importing the strategies (FSDP2, DTensor, sharded
checkpoints): Lightning's ``ModelParallelStrategy`` and its subclasses (``fsdp2``, ``tensor_parallel``) are told
apart by class, which ``lightning.pytorch`` defines whether or not they run.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy


def data_parallel_world(strategy: Any) -> tuple[int, int] | None:
    """``(data-parallel size, data-parallel rank)`` of a model-parallel strategy; ``None`` for any other strategy.

    Ranks of one tensor-parallel group compute one model replica together and must load the same samples.
    """
    if not isinstance(strategy, ModelParallelStrategy):
        return None
    kwargs = strategy.distributed_sampler_kwargs
    return int(kwargs["num_replicas"]), int(kwargs["rank"])
