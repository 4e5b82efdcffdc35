"""One run of the command line, put together in the order it happens.

``TemplateCLI`` (``cli.py``) reads the command line with LightningCLI's parser; ``run_command`` below does
everything after, top to bottom: the run's facts derived once, the checks, the run directory, the checkpoint, the
loggers, the model and data, the callbacks in the order they run, the Trainer, the subcommand. A step that needs a
fact reads it from ``RunFacts`` (``facts.py``), never from the options again.
"""

from __future__ import annotations

import contextlib
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback, ModelSummary, ProgressBar, Timer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.strategies import ModelParallelStrategy

from multigpu import compat
from multigpu.callbacks.compile import CompileModel
from multigpu.callbacks.continuation import ExactContinuation, RunTimer
from multigpu.callbacks.loaders import EngineLoaders
from multigpu.callbacks.precision import Float64Metrics, PrecisionBeforeRestore
from multigpu.callbacks.preemption import forward_stop_signals_to_workers
from multigpu.callbacks.progress import progress_bar
from multigpu.callbacks.random_state import RandomState
from multigpu.callbacks.ranks import DestroyProcessGroupAtExit, StopOtherRanksOnError, UnshareSpawnedTensors
from multigpu.callbacks.stack_dumps import StackDumps
from multigpu.callbacks.summary import ModelSummary as FlopsAwareModelSummary
from multigpu.checkpoints.resume import resolve_checkpoint
from multigpu.checks import check_before_launch, check_built, check_resumed
from multigpu.command import prog
from multigpu.errors import DEBUG_ENV, ConfigurationError, causes, describe
from multigpu.facts import RunFacts
from multigpu.failures import user_error_of
from multigpu.reporting import report_desk
from multigpu.run_dir import place_loggers, shared_random_seed
from multigpu.run_lock import hold_run_dir, release_run_dir, this_launch
from multigpu.strategies import FSDP2Strategy, TensorParallelStrategy
from multigpu.strategies.model_parallel import ClipAcrossMeshes
from multigpu.strategies.pipeline import PipelineStrategy
from multigpu.trainer_arguments import (
    checkpoint_plugins,
    flight_recorder_defaults,
    strategy_class,
    strategy_options,
)


def run_command(cli: LightningCLI) -> None:
    """Everything after the parse, for the options ``cli.config`` holds (``cli``: a ``TemplateCLI`` that has
    parsed): build the run and, where the command names a subcommand, check it first and run it. ``cli.facts``,
    ``cli.model``, ``cli.datamodule`` and ``cli.trainer`` are set on the way, as LightningCLI sets them."""
    options = cli.chosen()
    cli.facts = facts = RunFacts.of(options, cli.subcommand)

    resumed = None
    if facts.subcommand is not None:
        # the checks of the options: a bad launch fails here in a second, with nothing taken or written
        check_before_launch(facts, options, cli.argv)
        # the run directory, held for this run until the command ends (another live run's is refused), before the
        # checkpoint is read: a live run's folder is neither read nor repaired
        hold_run_dir(facts.run_dir, facts.subcommand, this_launch())
        # the checkpoint, resolved (`last`, a damaged newest file replaced by the newest intact one) and read once
        resumed = resolve_checkpoint(facts.subcommand, options)
        check_resumed(resumed, options, cli.argv)
        cli.facts = facts = facts.resuming(resumed[0] if resumed else None)
        if options.get("seed_everything") is True:
            options["seed_everything"] = shared_random_seed()  # the same on every process of one launch

    # LightningCLI's own steps after its parse: the checkpoint's model options, the seed, hyperparameters as parsed
    compat.apply_checkpoint_hyperparameters(cli)
    compat.seed_from_options(cli)
    if cli.load_from_checkpoint_support:
        compat.save_hyperparameters_as_parsed(cli)
    options = cli.chosen()  # the checkpoint's model options may have replaced the config

    cli.before_instantiate_classes()  # the project's hook
    place_loggers(options.trainer, facts.run_dir)
    # the objects the options name: the model, data module, loggers, your callbacks and the engine's with options;
    # building them is the boundary where any exception is a bad value in the options
    try:
        cli.config_init = cli.parser.instantiate_classes(cli.config)
    except Exception as error:
        raise building_error(error, facts, objects_built=False) from error
    built = cli.chosen(cli.config_init)
    cli.model, cli.datamodule = built.get("model"), built.get("data")
    compat.add_optimizer_options_to_model(cli)

    callbacks, switches, off = run_callbacks(options, built)
    strategy_settings = strategy_options(facts.trainer_strategy, options.get("collective_timeout"), cli.model)
    if facts.trainer_strategy == PipelineStrategy.strategy_name:
        strategy_settings.update(options.pipeline.as_dict())  # --pipeline.*
    checkpoint = built.get("checkpoint") if "checkpoint" not in off else None
    plugins = checkpoint_plugins(
        built.trainer.get("plugins"),
        slurm_requeue="preemption" in off,
        background=bool(getattr(checkpoint, "async_save", False)),  # --checkpoint.async_save
    )
    flight_recorder_defaults(facts)  # NCCL's variables, before the process group exists
    arguments = {"strategy": facts.trainer_strategy} if strategy_settings else {}
    try:
        # a strategy given by name is built from Lightning's registry, which keeps its precision handling
        with compat.registered_with(
            arguments.get("strategy"), strategy_settings, strategy_class(arguments.get("strategy"))
        ):
            cli.trainer = cli.instantiate_trainer(**arguments, **switches, callbacks=callbacks, plugins=plugins)
    except Exception as error:
        raise building_error(error, facts, objects_built=True) from error

    if facts.subcommand is not None:
        check_built(facts.subcommand, options, cli.model, cli.datamodule, cli.trainer, resumed)
    del resumed  # checked: the memory-mapped file is Lightning's to read now
    cli.after_instantiate_classes()  # the project's hook

    if facts.subcommand is not None:
        # under ddp_spawn the launching process passes stop signals on to its workers while they train; under ddp
        # from one command this process speaks for the ranks it starts (multigpu/reporting.py)
        speaks = compat.starts_other_ranks(cli.trainer)
        desk = report_desk(cli.trainer, before_exit=release_run_dir) if speaks else contextlib.nullcontext()
        with forward_stop_signals_to_workers(facts.strategy if facts.subcommand == "fit" else None), desk:
            compat.run_subcommand(cli)


def run_callbacks(options: Namespace, built: Namespace) -> tuple[list[Callback], dict[str, Any], set[str]]:
    """The run's callbacks in the order the Trainer holds them, which is the order Lightning calls them at each hook;
    the Trainer switches that go with them; the names of the callbacks left out (``--callbacks_off``, and
    ``checkpoint`` where checkpointing is off). Lightning then appends LightningCLI's ``SaveConfigCallback`` and
    moves the ``ModelCheckpoint`` to the end.

    ``options``: the run's parsed options (``--callbacks_off``, ``--progress_bar``, ``--compile``, ...); ``built``:
    the objects built from them (your ``--trainer.callbacks``, the engine's callbacks with options). What each
    callback does: ``multigpu/callbacks/__init__.py``.
    """
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
    strategy = trainer.get("strategy")  # built, where given as a class_path
    # Lightning's own ModelParallelStrategy, given as a class_path, clips with torch's clipping unless told
    clip_across_meshes = isinstance(strategy, ModelParallelStrategy) and not isinstance(
        strategy, (FSDP2Strategy, TensorParallelStrategy)
    )

    def engine(name: str) -> Callback | None:
        """The engine's callback with options ``name`` (``--<name>.*``), unless ``--callbacks_off`` names it."""
        return None if name in off else built.get(name)

    callbacks = [
        *yours,
        engine("throughput"),  # before the progress bar, which shows the interval it measured
        bar,
        summary,
        CompileModel() if options.get("compile") else None,
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
    """One paragraph for an exception raised while the objects of the options were built: jsonargparse builds the
    model, data, callbacks and loggers (naming the classes of ``facts``), then the Trainer."""
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
