"""What the engine adds to Lightning's Trainer besides the callbacks: the strategy's class and options, the plugins,
and NCCL's flight recorder in ``os.environ``."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, Strategy, StrategyRegistry

from multigpu.argv import import_class
from multigpu.callbacks.stack_dumps import STACKS_DIR
from multigpu.checkpoints.background import BackgroundCheckpointIO
from multigpu.checkpoints.files import with_atomic_io
from multigpu.compat import optimizer_count, registered_strategy
from multigpu.facts import RunFacts
from multigpu.strategies.ddp import DDPStrategy as StartBoundedDDPStrategy

#: long enough for checkpointing and validation, short of Lightning's 30 minutes that a dead rank holds the others
COLLECTIVE_TIMEOUT_S = 900.0
FLIGHT_RECORDER_ENTRIES = 2000
#: the flight recorder's variables, each with the older name PyTorch still reads
FLIGHT_RECORDER_NAMES = {
    "TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
}


def flight_recorder_defaults(facts: RunFacts) -> dict[str, str]:
    """NCCL's flight recorder on for several CUDA processes: each rank writes its last collectives to
    ``<run dir>/stacks/nccl/`` when one times out, for ``torchfrtrace``. The variables set (none the user set)."""
    if not facts.several_cuda_processes:
        return {}
    folder = facts.run_dir / STACKS_DIR / "nccl"
    values = {
        "TORCH_FR_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(folder / "nccl_trace_rank_"),
    }
    unset = [name for name in values if not {name, FLIGHT_RECORDER_NAMES[name]} & set(os.environ)]
    chosen = {name: values[name] for name in unset}
    if "TORCH_FR_DUMP_TEMP_FILE" in chosen:
        folder.mkdir(parents=True, exist_ok=True)  # NCCL writes the files, not the folder
    os.environ.update(chosen)  # the ranks the launcher starts inherit them
    return chosen


def strategy_as_class(trainer: Namespace) -> None:
    """``--trainer.strategy=package.module.Class`` as a ``class_path``: jsonargparse keeps the string, since the option
    also takes a name, which Lightning would refuse."""
    strategy = trainer.get("strategy")
    if not isinstance(strategy, str) or "." not in strategy or strategy.lower() in StrategyRegistry:
        return
    named = import_class(strategy)
    if isinstance(named, type) and issubclass(named, Strategy):
        trainer["strategy"] = Namespace(class_path=strategy)


def strategy_options(strategy: Any, seconds: float | None, model: L.LightningModule) -> dict[str, Any]:
    """What the engine adds to a strategy given by name: ``--collective_timeout``, and ddp's
    ``find_unused_parameters`` for a model that backpropagates one part at a time."""
    registered = registered_strategy(strategy) if isinstance(strategy, str) else None
    if registered is None:
        return {}
    strategy_class, init_params = registered
    options: dict[str, Any] = {}
    if seconds is not None and issubclass(strategy_class, (DDPStrategy, ModelParallelStrategy)):
        options["timeout"] = timedelta(seconds=seconds)
    ddp = issubclass(strategy_class, DDPStrategy)
    if ddp and "find_unused_parameters" not in init_params and steps_networks_apart(model):
        options["find_unused_parameters"] = True  # a GAN backpropagates one network at a time: some get no grad
    return options


def strategy_class(strategy: Any) -> type[Strategy] | None:
    """Every ``ddp`` name as the engine's ``DDPStrategy``, whose ranks may take longer to start than a collective
    may wait; None where the registered class stands."""
    registered = registered_strategy(strategy) if isinstance(strategy, str) else None
    if registered is not None and registered[0] is DDPStrategy:
        return StartBoundedDDPStrategy
    return None


def steps_networks_apart(model: L.LightningModule) -> bool:
    """Whether a backward of ``model`` may leave parameters without a gradient: manual optimization with several
    optimizers, or uncounted ones. DDP's search costs a graph traversal at every backward and a warning where it
    finds none."""
    if model.automatic_optimization:
        return False
    count = optimizer_count(model)
    return count is None or count > 1


def checkpoint_plugins(plugins: Any, slurm_requeue: bool = False, background: bool = False) -> list[Any]:
    """The user's ``--trainer.plugins`` with atomic checkpoint saving (on a thread with ``background``); under SLURM
    without Lightning's requeue unless ``slurm_requeue`` (preemption off)."""
    plugins = with_atomic_io(plugins, BackgroundCheckpointIO() if background else None)
    # the environment Lightning would pick, which detects torchrun first (it also runs inside SLURM jobs)
    slurm = SLURMEnvironment.detect() and not TorchElasticEnvironment.detect()
    if not slurm_requeue and slurm and not any(isinstance(p, ClusterEnvironment) for p in plugins):
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return plugins
