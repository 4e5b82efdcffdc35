"""What the template adds to Lightning's launch, decided from the options before the Trainer is built: the
strategy (``auto`` named where Lightning would pick ddp, an import path as its class), the options a strategy given
by name gets (``--collective_timeout``, ddp's ``find_unused_parameters``), and the plugins (atomic checkpoints,
SLURM's environment without Lightning's requeue)."""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, Strategy, StrategyRegistry

from src.checkpoints.files import with_atomic_io
from src.checks import import_class, requested_devices, resolve_accelerator
from src.compat import registered_strategy

#: a collective that waits longer fails the job: long enough for checkpointing and validation, short enough
#: that a dead rank does not hold the others for Lightning's default of 30 minutes
COLLECTIVE_TIMEOUT_S = 900.0


def strategy_name(trainer: Namespace | dict[str, Any]) -> Any:
    """``--trainer.strategy``, with ``auto`` named ``ddp`` where Lightning picks it (several processes), so that
    such a run gets the template's collective timeout and DDP options too."""
    strategy = trainer.get("strategy")
    if strategy != "auto" or hasattr(sys, "ps1") or sys.flags.interactive:  # a notebook: Lightning forks there
        return strategy
    devices = requested_devices(trainer.get("devices", "auto"), resolve_accelerator(trainer.get("accelerator", "auto")))
    many = (devices or 1) > 1 or (trainer.get("num_nodes") or 1) > 1
    return "ddp" if many else strategy


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
    if ddp and not model.automatic_optimization and "find_unused_parameters" not in init_params:
        options["find_unused_parameters"] = True  # a GAN backpropagates one network at a time: some get no grad
    return options


def checkpoint_plugins(plugins: Any, slurm_requeue: bool = False) -> list[Any]:
    """The user's ``--trainer.plugins`` with atomic checkpoint saving (``src/checkpoints/files.py``); under SLURM
    without Lightning's save-and-requeue in its signal handler unless ``slurm_requeue`` (preemption off)."""
    plugins = with_atomic_io(plugins)
    # the environment Lightning would pick itself, with one switch changed: SLURM's, unless torchrun started the
    # processes (Lightning detects TorchElastic first, since torchrun also runs inside SLURM jobs)
    slurm = SLURMEnvironment.detect() and not TorchElasticEnvironment.detect()
    if not slurm_requeue and slurm and not any(isinstance(p, ClusterEnvironment) for p in plugins):
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return plugins
