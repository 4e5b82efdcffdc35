"""Strategies this template adds to Lightning's registry (``dp``, ``fsdp2``, ``tensor_parallel``, ``pipeline``)."""

from multigpu.strategies.dp import DataParallelStrategy, register_dp_strategy
from multigpu.strategies.model_parallel import (
    FSDP2Strategy,
    TensorParallelStrategy,
    prediction_replica,
    register_model_parallel_strategies,
)
from multigpu.strategies.pipeline import PipelineStrategy, register_pipeline_strategy

__all__ = [
    "DataParallelStrategy",
    "FSDP2Strategy",
    "PipelineStrategy",
    "TensorParallelStrategy",
    "prediction_replica",
    "register_dp_strategy",
    "register_model_parallel_strategies",
    "register_pipeline_strategy",
]
