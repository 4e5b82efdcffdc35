"""What the run's Trainer is built with: the callbacks in order, the strategy, the plugins, NCCL's flight recorder."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment
from lightning.pytorch.callbacks import Callback, ModelSummary, ProgressBar, Timer
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, Strategy, StrategyRegistry

from multigpu.checkpoints.background import BackgroundCheckpointIO
from multigpu.checkpoints.continuation import ExactContinuation, RunTimer
from multigpu.checkpoints.files import with_atomic_io
from multigpu.checkpoints.random_state import RandomState
from multigpu.checkpoints.schedule import RunCheckpoint
from multigpu.command import prog
from multigpu.compat import optimizer_count, registered_strategy
from multigpu.data.engine_loaders import EngineLoaders
from multigpu.errors import DEBUG_ENV, ConfigurationError, causes, describe
from multigpu.errors.failures import user_error_of
from multigpu.facts import RunFacts
from multigpu.facts.argv import import_class
from multigpu.faults.nan_guard import NonFiniteLossGuard
from multigpu.faults.preemption import PreemptionCheckpoint
from multigpu.faults.ranks import DestroyProcessGroupAtExit, StopOtherRanksOnError, UnshareSpawnedTensors
from multigpu.faults.stack_dumps import STACKS_DIR, StackDumps
from multigpu.observe.progress import progress_bar
from multigpu.observe.run_plan import RunPlan
from multigpu.observe.straggler import StragglerReport
from multigpu.observe.summary import ModelSummary as FlopsAwareModelSummary
from multigpu.observe.throughput import SpeedMonitor
from multigpu.strategies import FSDP2Strategy, TensorParallelStrategy
from multigpu.strategies.compile import CompileModel
from multigpu.strategies.ddp import DDPStrategy as StartBoundedDDPStrategy
from multigpu.strategies.model_parallel import ClipAcrossMeshes
from multigpu.strategies.pipeline import PipelineStrategy
from multigpu.strategies.precision import Float64Metrics, PrecisionBeforeRestore

#: the names ``--callbacks_off`` accepts
OPTIONAL_CALLBACKS = (
    "progress_bar",
    "model_summary",
    "preemption",
    "throughput",
    "straggler",
    "run_plan",
    "nan_guard",
    "checkpoint",
)

#: the callbacks with options (``--checkpoint.*``, ...), which the parser builds (``multigpu/run/parser.py``)
CALLBACK_OPTIONS = {
    "preemption": PreemptionCheckpoint,
    "throughput": SpeedMonitor,
    "straggler": StragglerReport,
    "run_plan": RunPlan,
    "nan_guard": NonFiniteLossGuard,
    "checkpoint": RunCheckpoint,
}


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
    """NCCL's flight recorder to ``<run dir>/stacks/nccl/`` for several CUDA processes; the variables it set."""
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
    os.environ.update(chosen)
    return chosen


def strategy_as_class(trainer: Namespace) -> None:
    """``--trainer.strategy=package.Class`` as a ``class_path``: jsonargparse keeps the string Lightning refuses."""
    strategy = trainer.get("strategy")
    if not isinstance(strategy, str) or "." not in strategy or strategy.lower() in StrategyRegistry:
        return
    named = import_class(strategy)
    if isinstance(named, type) and issubclass(named, Strategy):
        trainer["strategy"] = Namespace(class_path=strategy)


def strategy_options(strategy: Any, seconds: float | None, model: L.LightningModule) -> dict[str, Any]:
    """What the engine adds to a strategy given by name: the timeout, and ddp's ``find_unused_parameters``."""
    registered = registered_strategy(strategy) if isinstance(strategy, str) else None
    if registered is None:
        return {}
    strategy_class, init_params = registered
    options: dict[str, Any] = {}
    if seconds is not None and issubclass(strategy_class, (DDPStrategy, ModelParallelStrategy)):
        options["timeout"] = timedelta(seconds=seconds)
    ddp = issubclass(strategy_class, DDPStrategy)
    if ddp and "find_unused_parameters" not in init_params and steps_networks_apart(model):
        options["find_unused_parameters"] = True
    return options


def strategy_class(strategy: Any) -> type[Strategy] | None:
    """The engine's ``DDPStrategy`` for a ``ddp`` name: its ranks may take longer to start than a collective waits."""
    registered = registered_strategy(strategy) if isinstance(strategy, str) else None
    if registered is not None and registered[0] is DDPStrategy:
        return StartBoundedDDPStrategy
    return None


def steps_networks_apart(model: L.LightningModule) -> bool:
    """Whether a backward may leave parameters without a gradient (DDP's search for them costs every backward)."""
    if model.automatic_optimization:
        return False
    count = optimizer_count(model)
    return count is None or count > 1


def checkpoint_plugins(
    plugins: Any, slurm_ranks: bool, slurm_requeue: bool = False, background: bool = False
) -> list[Any]:
    """The user's plugins with atomic checkpoint saving; where Lightning takes the ranks from SLURM
    (``facts.launch.slurm_ranks``), its SLURM environment without its requeue unless asked."""
    plugins = with_atomic_io(plugins, BackgroundCheckpointIO() if background else None)
    if not slurm_requeue and slurm_ranks and not any(isinstance(p, ClusterEnvironment) for p in plugins):
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return plugins


def trainer_settings(
    facts: RunFacts, built: Namespace, model: Any, off: set[str]
) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """The Trainer's strategy argument (where the engine adds options to it), those options and the plugins."""
    settings = strategy_options(facts.trainer_strategy, facts.collective_timeout, model)
    if facts.trainer_strategy == PipelineStrategy.strategy_name:
        settings.update(facts.pipeline)
    checkpoint = built.get("checkpoint") if "checkpoint" not in off else None
    plugins = checkpoint_plugins(
        built.trainer.get("plugins"),
        facts.launch.slurm_ranks,
        slurm_requeue="preemption" in off,
        background=bool(getattr(checkpoint, "async_save", False)),
    )
    arguments = {"strategy": facts.trainer_strategy} if settings else {}
    return arguments, settings, plugins


def run_callbacks(facts: RunFacts, built: Namespace) -> tuple[list[Callback], dict[str, Any], set[str]]:
    """The run's callbacks in the order Lightning calls them, the Trainer switches they need, the names left out;
    ``built``: the objects the options built (the engine's callbacks by name, ``--trainer.callbacks``)."""
    off = set(facts.callbacks_off)
    yours = (built.get("trainer") or {}).get("callbacks") or []
    yours = list(yours) if isinstance(yours, list) else [yours]
    switches: dict[str, Any] = {}

    bar = None if "progress_bar" in off else progress_bar(facts.progress_bar)
    if not facts.lightning_progress_bar or any(isinstance(c, ProgressBar) for c in yours):
        bar = None
    elif bar is None:
        switches["enable_progress_bar"] = False
    summary = None
    if "model_summary" in off:
        switches["enable_model_summary"] = False
    elif facts.lightning_model_summary and not any(isinstance(c, ModelSummary) for c in yours):
        summary = FlopsAwareModelSummary()
        switches["enable_model_summary"] = False
    timer = None
    if facts.max_time is not None and not any(isinstance(c, Timer) for c in yours):
        timer = RunTimer(duration=facts.max_time)
        switches["max_time"] = None
    if not facts.lightning_checkpointing:
        off.add("checkpoint")  # the Trainer refuses a ModelCheckpoint when checkpointing is off
    elif "checkpoint" in off:
        switches["enable_checkpointing"] = False  # else Lightning adds a ModelCheckpoint of its own
    # torch's clipping in Lightning's ModelParallelStrategy refuses two meshes; the engine's strategies clip themselves
    strategy = facts.strategy_class
    clip_across_meshes = (
        strategy is not None
        and issubclass(strategy, ModelParallelStrategy)
        and not issubclass(strategy, (FSDP2Strategy, TensorParallelStrategy, PipelineStrategy))
    )

    def engine(name: str) -> Callback | None:
        return None if name in off else built.get(name)

    callbacks = [
        *yours,  # --trainer.callbacks run first at every hook
        engine("throughput"),  # before the progress bar, which shows the interval it measured
        bar,  # a plain line every 50 steps and after each validation, or Rich
        summary,  # the parameter table at fit start, FLOPs only where known
        CompileModel() if facts.compile else None,  # --compile=true: forward compiled at setup
        ClipAcrossMeshes() if clip_across_meshes else None,  # gradient clipping across device meshes
        EngineLoaders(per_process=facts.batch_size_per_process),  # the engine's sampling
        ExactContinuation(),  # a stop saved as the position it is: --ckpt_path=last continues exactly
        RandomState(),  # every rank's generators saved and restored: dropout draws as if uninterrupted
        timer,  # --trainer.max_time, stopping at a step boundary
        engine("preemption"),  # a stop signal: save last.ckpt, stop, requeue
        engine("straggler"),  # names a rank slower than the median
        engine("run_plan"),  # prints and saves run_plan.json when training starts
        engine("nan_guard"),  # stops at a non-finite loss, before a checkpoint is written
        engine("checkpoint"),  # best-<step>.ckpt and last.ckpt
        PrecisionBeforeRestore(),  # a "-true" precision: the module converted before a checkpoint loads into it
        Float64Metrics(),  # 64-true: torchmetrics states in float64
        StackDumps(),  # before StopOtherRanksOnError: the other ranks' stacks are taken before they are killed
        StopOtherRanksOnError(),  # an error on one rank stops the others
        UnshareSpawnedTensors(),  # private metric states in ddp_spawn workers
        DestroyProcessGroupAtExit(),  # else gloo may abort a finished rank
    ]
    return [callback for callback in callbacks if callback is not None], switches, off


def building_error(error: Exception, facts: RunFacts, objects_built: bool) -> ConfigurationError:
    """One paragraph for an exception raised while the options' objects were built."""
    known = user_error_of(error)  # e.g. a constructor that downloads: no network, not a wrong option
    if known is not None:
        return known
    if objects_built:
        what = "the Trainer from the --trainer options"
    else:
        chosen = {"model": facts.model_class, "data": facts.data_class}
        named = [f"--{key}={class_path}" for key, class_path in chosen.items() if class_path]
        what = f"the objects of the config ({', '.join(named)}, the callbacks and loggers)"
    return ConfigurationError(
        f"building {what} failed: {describe(causes(error)[-1])}. Fix: correct the option this names (`{prog()} fit"
        f" --help` lists them, `--model.help CLASS` and `--data.help CLASS` a class's); set {DEBUG_ENV}=true to"
        " see the traceback."
    )
