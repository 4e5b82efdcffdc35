"""What the run's Trainer is built with: the callbacks as one literal list in the order they run, the strategy's
options and the plugins; and the paragraph for an exception raised while the options' objects are built."""

from __future__ import annotations

from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback, ModelSummary, ProgressBar, Timer
from lightning.pytorch.strategies import ModelParallelStrategy

from multigpu.callbacks.compile import CompileModel
from multigpu.callbacks.continuation import ExactContinuation, RunTimer
from multigpu.callbacks.loaders import EngineLoaders
from multigpu.callbacks.precision import Float64Metrics, PrecisionBeforeRestore
from multigpu.callbacks.progress import progress_bar
from multigpu.callbacks.random_state import RandomState
from multigpu.callbacks.ranks import DestroyProcessGroupAtExit, StopOtherRanksOnError, UnshareSpawnedTensors
from multigpu.callbacks.stack_dumps import StackDumps
from multigpu.callbacks.summary import ModelSummary as FlopsAwareModelSummary
from multigpu.command import prog
from multigpu.errors import DEBUG_ENV, ConfigurationError, causes, describe
from multigpu.facts import RunFacts
from multigpu.failures import user_error_of
from multigpu.strategies import FSDP2Strategy, TensorParallelStrategy
from multigpu.strategies.model_parallel import ClipAcrossMeshes
from multigpu.strategies.pipeline import PipelineStrategy
from multigpu.trainer_arguments import checkpoint_plugins, strategy_options


def trainer_settings(
    facts: RunFacts, options: Namespace, built: Namespace, model: Any, off: set[str]
) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """The Trainer's strategy argument (where the engine adds options to it), those options and the plugins;
    ``off``: the callbacks left out."""
    settings = strategy_options(facts.trainer_strategy, options.get("collective_timeout"), model)
    if facts.trainer_strategy == PipelineStrategy.strategy_name:
        settings.update(options.pipeline.as_dict())
    checkpoint = built.get("checkpoint") if "checkpoint" not in off else None
    plugins = checkpoint_plugins(
        built.trainer.get("plugins"),
        slurm_requeue="preemption" in off,
        background=bool(getattr(checkpoint, "async_save", False)),
    )
    arguments = {"strategy": facts.trainer_strategy} if settings else {}
    return arguments, settings, plugins


def run_callbacks(
    facts: RunFacts, options: Namespace, built: Namespace
) -> tuple[list[Callback], dict[str, Any], set[str]]:
    """The run's callbacks in the order Lightning calls them at each hook (it then appends ``SaveConfigCallback`` and
    moves the ``ModelCheckpoint`` last), the Trainer switches that go with them, and the names of those left out.
    What each does: ``multigpu/callbacks/__init__.py``."""
    trainer = built.get("trainer") or {}
    off = set(options.get("callbacks_off") or [])
    yours = trainer.get("callbacks") or []
    yours = list(yours) if isinstance(yours, list) else [yours]
    switches: dict[str, Any] = {}

    bar = None if "progress_bar" in off else progress_bar(options.get("progress_bar", "auto"))
    if trainer.get("enable_progress_bar") is False or any(isinstance(c, ProgressBar) for c in yours):
        bar = None  # none, or yours
    elif bar is None:
        switches["enable_progress_bar"] = False
    summary = None
    summarises = trainer.get("enable_model_summary") is not False and not trainer.get("barebones")
    if "model_summary" in off:
        switches["enable_model_summary"] = False
    elif summarises and not any(isinstance(c, ModelSummary) for c in yours):
        summary = FlopsAwareModelSummary()  # no column of zero FLOPs
        switches["enable_model_summary"] = False  # Lightning's own is replaced (else it logs that it skips it)
    timer = None
    if trainer.get("max_time") is not None and not any(isinstance(c, Timer) for c in yours):
        timer = RunTimer(duration=trainer.get("max_time"))  # the same limit, stopping at a step boundary
        switches["max_time"] = None
    if trainer.get("enable_checkpointing") is False:
        off.add("checkpoint")  # the Trainer refuses a ModelCheckpoint when checkpointing is off
    elif "checkpoint" in off:
        switches["enable_checkpointing"] = False  # else Lightning adds a ModelCheckpoint of its own
    # Lightning's own ModelParallelStrategy clips with torch's clipping, which refuses two meshes; the engine's
    # model-parallel strategies clip across them themselves
    strategy = facts.strategy_class
    clip_across_meshes = (
        strategy is not None
        and issubclass(strategy, ModelParallelStrategy)
        and not issubclass(strategy, (FSDP2Strategy, TensorParallelStrategy, PipelineStrategy))
    )

    def engine(name: str) -> Callback | None:  # one with options (--<name>.*)
        return None if name in off else built.get(name)

    callbacks = [
        *yours,
        engine("throughput"),  # before the progress bar, which shows the interval it measured
        bar,
        summary,
        CompileModel() if facts.compile else None,
        ClipAcrossMeshes() if clip_across_meshes else None,
        EngineLoaders(per_process=bool(options.get("batch_size_per_process"))),
        ExactContinuation(),
        RandomState(),
        timer,
        engine("preemption"),
        engine("straggler"),
        engine("run_plan"),
        engine("nan_guard"),
        engine("checkpoint"),
        PrecisionBeforeRestore(),
        Float64Metrics(),
        StackDumps(),  # before StopOtherRanksOnError: the other ranks' stacks are taken before they are killed
        StopOtherRanksOnError(),
        UnshareSpawnedTensors(),
        DestroyProcessGroupAtExit(),
    ]
    return [callback for callback in callbacks if callback is not None], switches, off


def building_error(error: Exception, facts: RunFacts, objects_built: bool) -> ConfigurationError:
    """One paragraph for an exception raised while the options' objects were built (the classes, then the Trainer)."""
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
