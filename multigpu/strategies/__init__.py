"""Strategies this template adds to Lightning's registry (``dp``, ``fsdp2``, ``tensor_parallel``, ``pipeline``), and the
one place that registers them: every ``TemplateCLI`` run calls ``register_strategies()`` before it parses, so that
``--trainer.strategy=<name>`` resolves; a script of your own calls it before ``Trainer(strategy="<name>")``."""

from lightning.pytorch.strategies import StrategyRegistry

from multigpu.strategies.dp import DataParallelStrategy
from multigpu.strategies.model_parallel import FSDP2Strategy, TensorParallelStrategy, prediction_replica
from multigpu.strategies.pipeline import PipelineStrategy

#: each name with its class and the description Lightning's registry lists (``StrategyRegistry.available_strategies``)
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


# the names of 1.0 and 1.1, each a family's registration: kept through 1.x, each now registers every strategy
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
