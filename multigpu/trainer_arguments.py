"""What the engine adds to Lightning's Trainer besides the callbacks (``multigpu/run.py`` lists those), decided from
the options before it is built: the strategy (an import path as its class), the options a strategy given by name
gets (``--collective_timeout``, ddp's ``find_unused_parameters``), the plugins (atomic checkpoints written in the
background, SLURM's environment without Lightning's requeue), and NCCL's flight recorder in ``os.environ``."""

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

#: a collective that waits longer fails the job: long enough for checkpointing and validation, short enough
#: that a dead rank does not hold the others for Lightning's default of 30 minutes
COLLECTIVE_TIMEOUT_S = 900.0
#: NCCL's flight recorder: how many of the last collectives each rank keeps (their kind, sizes, state and stack)
FLIGHT_RECORDER_ENTRIES = 2000
#: the flight recorder's variables, each with the older name PyTorch still reads (one set by the user wins)
FLIGHT_RECORDER_NAMES = {
    "TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
}


def flight_recorder_defaults(facts: RunFacts) -> dict[str, str]:
    """For a run of several CUDA processes, NCCL's flight recorder on: every rank keeps its last collectives and
    writes them to ``<run dir>/stacks/nccl/nccl_trace_rank_<N>`` when one times out, for ``torchfrtrace``; the
    variables set in ``os.environ`` (each only where neither it nor its older name is set), or none on CPUs and one
    device."""
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
    os.environ.update(chosen)  # before the process group exists; the ranks the launcher starts inherit them
    return chosen


def strategy_as_class(trainer: Namespace) -> None:
    """``--trainer.strategy=package.module.Class`` as that class with its defaults, as a ``class_path`` is: the option
    also takes a name, so jsonargparse keeps the string, which Lightning would refuse as an unknown name."""
    strategy = trainer.get("strategy")
    if not isinstance(strategy, str) or "." not in strategy or strategy.lower() in StrategyRegistry:
        return
    named = import_class(strategy)
    if isinstance(named, type) and issubclass(named, Strategy):
        trainer["strategy"] = Namespace(class_path=strategy)


def strategy_options(strategy: Any, seconds: float | None, model: L.LightningModule) -> dict[str, Any]:
    """The arguments the template adds to a strategy given by name (one given as a class keeps its own settings):
    ``--collective_timeout`` for the ddp family, fsdp2 and tensor_parallel, and ddp's ``find_unused_parameters``
    for a model that backpropagates one part at a time."""
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
    """The class the engine builds a strategy given by name as, where not the registered one: Lightning's
    ``DDPStrategy`` (every ``ddp`` name) as the engine's subclass, whose ranks may take longer to start than a
    collective may wait (``multigpu/strategies/ddp.py``; fsdp2, tensor_parallel and pipeline do so themselves)."""
    registered = registered_strategy(strategy) if isinstance(strategy, str) else None
    if registered is not None and registered[0] is DDPStrategy:
        return StartBoundedDDPStrategy
    return None


def steps_networks_apart(model: L.LightningModule) -> bool:
    """Whether a backward of ``model`` leaves parameters without a gradient, as far as can be told before the
    Trainer: manual optimization with several optimizers (a GAN steps one network at a time), or whose optimizers
    cannot be counted yet (``configure_optimizers`` asks for the Trainer). DDP's search for unused parameters costs a
    traversal of the autograd graph at every backward and a warning on every rank where it finds none; a model that
    has unused parameters otherwise says so with ``--trainer.strategy=ddp_find_unused_parameters_true``."""
    if model.automatic_optimization:
        return False
    count = optimizer_count(model)
    return count is None or count > 1


def checkpoint_plugins(plugins: Any, slurm_requeue: bool = False, background: bool = False) -> list[Any]:
    """The user's ``--trainer.plugins`` with atomic checkpoint saving (``multigpu/checkpoints/files.py``), written on a
    background thread with ``background`` (``multigpu/checkpoints/background.py``); under SLURM without Lightning's
    save-and-requeue in its signal handler unless ``slurm_requeue`` (preemption off)."""
    plugins = with_atomic_io(plugins, BackgroundCheckpointIO() if background else None)
    # the environment Lightning would pick itself, with one switch changed: SLURM's, unless torchrun started the
    # processes (Lightning detects TorchElastic first, since torchrun also runs inside SLURM jobs)
    slurm = SLURMEnvironment.detect() and not TorchElasticEnvironment.detect()
    if not slurm_requeue and slurm and not any(isinstance(p, ClusterEnvironment) for p in plugins):
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return plugins
