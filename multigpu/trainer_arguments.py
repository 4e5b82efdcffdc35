"""Everything the template adds to Lightning's Trainer, decided from the options before it is built
(``trainer_arguments``, which the command line builds the Trainer with, once): the callbacks in their order
(``multigpu/callbacks/__init__.py``), the strategy (``auto`` named where Lightning would pick ddp, an import path as its
class), the options a strategy given by name gets (``--collective_timeout``, ddp's ``find_unused_parameters``,
``--pipeline.*``), and the plugins (atomic checkpoints written in the background, SLURM's environment without
Lightning's requeue). ``flight_recorder_defaults`` sets NCCL's variables in ``os.environ``, a step of its own of the
command line just before."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, Strategy, StrategyRegistry

from multigpu.arguments import import_class
from multigpu.callbacks import template_callbacks
from multigpu.callbacks.stack_dumps import STACKS_DIR
from multigpu.checkpoints.background import BackgroundCheckpointIO
from multigpu.checkpoints.files import with_atomic_io
from multigpu.compat import optimizer_count, registered_strategy
from multigpu.environment import requested_devices, resolve_accelerator
from multigpu.strategies.pipeline import PipelineStrategy

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


def trainer_arguments(built: Any, options: Any, model: L.LightningModule) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Trainer's arguments that the template adds, and the options of its strategy given by name (for
    ``compat.registered_with``: a strategy by name is built from Lightning's registry, which keeps its precision
    handling). ``built``: the objects the parser built (the ``--trainer`` options, the template's callbacks);
    ``options``: the run's parsed options (``--callbacks_off``, ``--collective_timeout``, ``--pipeline.*``, ...).

    ``strategy`` is among the arguments where the strategy gets options (``auto`` named as ``ddp``); ``callbacks`` holds
    your ``--trainer.callbacks`` and the template's, in the order ``multigpu/callbacks/__init__.py`` lists, with the
    switches that go with them (Lightning's own progress bar and summary off where the template's replace them).
    """
    trainer = built.get("trainer") or {}
    strategy = strategy_name(trainer)
    strategy_settings = strategy_options(strategy, options.get("collective_timeout"), model)
    if strategy == PipelineStrategy.strategy_name:
        strategy_settings.update(options.pipeline.as_dict())  # --pipeline.*
    callbacks, switches = template_callbacks(trainer, options, built, strategy)
    off = switches.pop("off")
    checkpoint = None if "checkpoint" in off else built.get("checkpoint")
    background = bool(getattr(checkpoint, "async_save", False))  # --checkpoint.async_save
    plugins = checkpoint_plugins(trainer.get("plugins"), slurm_requeue="preemption" in off, background=background)
    arguments = {"strategy": strategy} if strategy_settings else {}
    return {**arguments, **switches, "callbacks": callbacks, "plugins": plugins}, strategy_settings


def strategy_name(trainer: Namespace | dict[str, Any]) -> Any:
    """``--trainer.strategy``, with ``auto`` named ``ddp`` where Lightning picks it (several processes), so that
    such a run gets the template's collective timeout and DDP options too."""
    strategy = trainer.get("strategy")
    if strategy != "auto" or hasattr(sys, "ps1") or sys.flags.interactive:  # a notebook: Lightning forks there
        return strategy
    devices = requested_devices(trainer.get("devices", "auto"), resolve_accelerator(trainer.get("accelerator", "auto")))
    many = (devices or 1) > 1 or (trainer.get("num_nodes") or 1) > 1
    return "ddp" if many else strategy


def flight_recorder_defaults(trainer: Namespace | dict[str, Any], run_dir: str | None) -> dict[str, str]:
    """For a run of several CUDA processes, NCCL's flight recorder on: every rank keeps its last collectives and
    writes them to ``<run dir>/stacks/nccl/nccl_trace_rank_<N>`` when one times out, for ``torchfrtrace``; the
    variables set (each only where neither it nor its older name is set), or none on CPUs and one device."""
    accelerator = resolve_accelerator(trainer.get("accelerator", "auto"))
    devices = requested_devices(trainer.get("devices", "auto"), accelerator)
    if accelerator != "cuda" or ((devices or 1) <= 1 and (trainer.get("num_nodes") or 1) <= 1):
        return {}
    folder = Path(run_dir or os.getcwd()) / STACKS_DIR / "nccl"
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
