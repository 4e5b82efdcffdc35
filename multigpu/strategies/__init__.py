"""The strategies the engine adds to Lightning's registry; a script of your own calls ``register_strategies()``
before ``Trainer(strategy="<name>")``."""

from lightning.pytorch.strategies import StrategyRegistry

from multigpu.strategies.dp import DataParallelStrategy
from multigpu.strategies.model_parallel import FSDP2Strategy, TensorParallelStrategy, prediction_replica
from multigpu.strategies.pipeline import PipelineStrategy

STRATEGIES = {
    DataParallelStrategy.strategy_name: (
        DataParallelStrategy,
        "DataParallel: one process, each forward split across the GPUs",
    ),
    FSDP2Strategy.strategy_name: (
        FSDP2Strategy,
        "FSDP2: parameters, gradients and optimizer state sharded over all ranks",
    ),
    TensorParallelStrategy.strategy_name: (
        TensorParallelStrategy,
        "Tensor parallel within a node, FSDP2 across nodes",
    ),
    PipelineStrategy.strategy_name: (
        PipelineStrategy,
        "Pipeline parallel: layers in stages over ranks, FSDP2 within a stage",
    ),
}


def register_strategies() -> None:
    """Make each name of ``STRATEGIES`` resolve to its class in Lightning's registry (idempotent)."""
    for name, (strategy, description) in STRATEGIES.items():
        if name not in StrategyRegistry:
            StrategyRegistry.register(name, strategy, description=description)


# public in 1.x
register_dp_strategy = register_model_parallel_strategies = register_pipeline_strategy = register_strategies

__all__ = [
    "STRATEGIES",
    "DataParallelStrategy",
    "FSDP2Strategy",
    "PipelineStrategy",
    "TensorParallelStrategy",
    "prediction_replica",
    "register_dp_strategy",
    "register_model_parallel_strategies",
    "register_pipeline_strategy",
    "register_strategies",
]
