"""The command line: ``python -m src.cli {fit,validate,test,predict,tune} [--config FILE ...] [--key=value ...]``.

Every option comes from LightningCLI (the README's "The command line" has the rules); ``configs/default.yaml`` is
read first. On top of LightningCLI this adds: checks of the launch before anything starts (``src/checks.py``),
loggers, checkpoints and a stable wandb run id under the run directory, preemption handling, and the ``dp``
strategy.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import uuid
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, NoReturn

import lightning as L
import yaml
from jsonargparse import ActionConfigFile, Namespace
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment, TorchElasticEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, Timer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, Strategy, StrategyRegistry
from torch.multiprocessing import ProcessExitedException

from src.callbacks import (
    OPTIONAL_CALLBACKS,
    NonFiniteLossGuard,
    PreemptionCheckpoint,
    RunCheckpoint,
    RunPlan,
    SpeedMonitor,
    progress_bar,
)
from src.callbacks.compile import CompileModel
from src.callbacks.continuation import ExactContinuation, RunTimer
from src.callbacks.precision import Float64Metrics, PrecisionBeforeRestore
from src.callbacks.preemption import STOP_EXIT_CODES, forward_stop_signals_to_workers
from src.callbacks.process_group import DestroyProcessGroupAtExit
from src.callbacks.random_state import RandomState
from src.callbacks.spawn import UnshareSpawnedTensors
from src.callbacks.summary import ModelSummary as FlopsAwareModelSummary
from src.checkpoints.files import with_atomic_io
from src.checkpoints.resume import checkpoint_dir, resolve_checkpoint
from src.checks import (
    check_checkpoint_fits,
    check_checkpoint_model,
    check_compile,
    check_launch,
    check_model_flags,
    check_optimizer,
    check_sequence_length,
    check_sync_batchnorm,
    import_class,
    requested_devices,
    resolve_accelerator,
    yaml_problem,
)
from src.compat import registered_strategy, registered_with, skip_default_config_files
from src.data.base import GlobalBatchDataModule
from src.errors import (
    DEBUG_ENV,
    ConfigurationError,
    StopOtherRanksOnError,
    TrainingStopped,
    causes,
    debug_mode,
    describe,
    report,
    user_error_of,
)
from src.quiet import silence_known_noise
from src.strategies import (
    FSDP2Strategy,
    TensorParallelStrategy,
    register_dp_strategy,
    register_model_parallel_strategies,
)
from src.strategies.model_parallel import ClipAcrossMeshes
from src.tuning import Trainer as TuningTrainer

PROG = "python -m src.cli"
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict", "tune")
UNSET_SAVE_DIRS = (None, "", ".")
WANDB_ID_FILE = "wandb_run_id"
#: a collective that waits longer fails the job: long enough for checkpointing and validation, short enough
#: that a dead rank does not hold the others for Lightning's default of 30 minutes
COLLECTIVE_TIMEOUT_S = 900.0
#: the template's callbacks that take options (``--checkpoint.*``, ``--preemption.*``, ...), in hook order
CALLBACK_OPTIONS = {
    "preemption": PreemptionCheckpoint,
    "throughput": SpeedMonitor,
    "run_plan": RunPlan,
    "nan_guard": NonFiniteLossGuard,
    "checkpoint": RunCheckpoint,
}
#: the model-parallel strategies that clip across device meshes themselves
TEMPLATE_MODEL_PARALLEL = (FSDP2Strategy, TensorParallelStrategy)


def _stable_wandb_id(run_dir: str) -> str:
    """One wandb run per run directory: the id is created once, on rank 0, and read back on every restart."""
    path = Path(run_dir) / WANDB_ID_FILE
    if path.is_file():
        return path.read_text().strip()
    run_id = os.environ.get("WANDB_RUN_ID") or uuid.uuid4().hex[:12]
    if rank_zero_only.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id + "\n")
    return run_id


def shared_random_seed() -> int:
    """The seed ``seed_everything: true`` draws, the same on every process of one launch: processes of a SLURM or
    torchrun job each run the command, so they derive it from the job's id (kept by a requeued job too)."""
    if "PL_GLOBAL_SEED" in os.environ:
        return int(os.environ["PL_GLOBAL_SEED"])
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if job_id != "none":
        return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "little")
    return random.SystemRandom().randrange(2**32)


class TemplateArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with short errors: the message and where to look, not the 150-line usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--trainer.max_epoch` must not silently mean max_epochs
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Namespace:
        # jsonargparse reports a YAML syntax error without the file's name; name it, with the line
        problem = yaml_problem(sys.argv[1:] if args is None else args)
        if problem is not None and self.exit_on_error and not debug_mode():
            sys.stderr.write(f"error: {problem}\n")
            self.exit(2)
        return super().parse_args(args, *rest, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debug_mode():
            super().error(message, ex)
        sys.stderr.write(
            f"error: {' '.join(message.split())}\nFix: correct that option. `{PROG} fit --help` (or validate, test,"
            " predict, tune) lists every option; `--model.help CLASS` and `--data.help CLASS` a model's or data"
            " module's.\n"
        )
        self.exit(2)


class TemplateCLI(LightningCLI):
    """LightningCLI with this template's defaults, checks and run-directory layout (see the module docstring)."""

    #: the ``--ckpt_path`` file and its contents, read once before launch for the checks
    resumed: tuple[Path, dict[str, Any]] | None = None

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        silence_known_noise()  # src/quiet.py: the lines every run printed that say nothing about the run
        register_dp_strategy()
        register_model_parallel_strategies()
        per_subcommand = {"default_config_files": [str(DEFAULT_CONFIG)], "default_env": True}
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("trainer_class", TuningTrainer)  # a Trainer with `tune` (src/tuning/)
        super().__init__(
            model_class=L.LightningModule,
            datamodule_class=L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            # run=False (in a notebook or script) builds one parser without subcommands: it reads the defaults too
            parser_kwargs={"prog": PROG, **(per_subcommand if not run else {"default_env": True})}
            | {name: dict(per_subcommand) for name in SUBCOMMANDS},
            parser_class=TemplateArgumentParser,
            auto_configure_optimizers=False,  # models take their optimizer as an argument (TemplateModule)
            args=args,
            run=run,
            **kwargs,
        )

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """LightningCLI's parser, with a ``--config`` help that says how it combines with other arguments."""
        kwargs.setdefault("dump_header", [f"lightning.pytorch=={L.__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c",
            "--config",
            action=ActionConfigFile,
            help="Path to a YAML (or JSON) config file; give it several times to combine files. Arguments apply in"
            " order and a later one wins: a --config file overrides the flags given before it, a flag overrides the"
            " files before it. Put --config files first and flags after them.",
        )
        return parser

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # `tune` takes its options from TuningTrainer.tune's arguments, as fit does from Trainer.fit's
        return {**LightningCLI.subcommands(), "tune": {"model", "datamodule"}}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # the template's callbacks with options of their own; instantiated by the parser, put in the Trainer's one list
        # by `instantiate_trainer` (in hook order, src/callbacks/__init__.py), not appended by LightningCLI
        for key, callback_class in CALLBACK_OPTIONS.items():
            parser.add_class_arguments(callback_class, key, fail_untyped=False, instantiate=True, sub_configs=True)
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/loss",
                "checkpoint.mode": "min",
                "checkpoint.save_last": True,
                "checkpoint.filename": "best-{step}",
                "checkpoint.auto_insert_metric_name": False,
                "checkpoint.enable_version_counter": False,  # a resumed run overwrites its own last.ckpt
            }
        )
        parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath", compute_fn=checkpoint_dir)
        parser.add_argument(
            "--callbacks_off",
            type=list[Literal[OPTIONAL_CALLBACKS]],  # type: ignore[valid-type]
            default=[],
            help="The template's optional callbacks to leave out of this run, e.g. [throughput,run_plan]; every"
            " callback the template adds is listed in src/callbacks/__init__.py.",
        )
        parser.add_argument(
            "--progress_bar",
            type=Literal["auto", "rich", "plain", "none"],
            default="auto",
            help="Progress output: auto (Rich on a terminal, plain lines otherwise), rich, plain or none.",
        )
        parser.add_argument(
            "--compile",
            type=bool,
            default=False,
            help="Compile the model's forward with torch.compile (src/callbacks/compile.py): single device, ddp and"
            " ddp_spawn (other strategies are refused before launch); checkpoints keep their keys. For a mode or"
            " backend, add src.callbacks.compile.CompileModel to --trainer.callbacks instead.",
        )
        parser.add_argument(
            "--collective_timeout",
            type=float | None,
            default=COLLECTIVE_TIMEOUT_S,
            help="Seconds a collective of several processes waits for the other ranks before the job fails, so that a"
            " stuck or dead rank cannot hang the job; for a strategy given by name (ddp, ddp_spawn, fsdp2,"
            " tensor_parallel, and auto with several processes). null leaves Lightning's own default (30 minutes). A"
            " strategy given as a class (class_path, with its init_args) keeps its own timeout. Raise it if rank 0"
            " alone does long work (a download).",
        )

    # -- checks before anything is instantiated --------------------------------------------------------------

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        self._parse_with_the_chosen_classes_defaults(parser, args)
        subcommand = self.config.get("subcommand")
        _strategy_as_class(self.config[subcommand].trainer if subcommand is not None else self.config.trainer)
        if subcommand is None:
            return
        config = self.config[subcommand]
        argv = sys.argv[1:] if args is None else args
        check_launch(config.trainer.as_dict(), batch_size=self._global_batch_size(config), args=argv)
        if config.get("compile"):
            check_compile(config.trainer.get("strategy"))
        # the checkpoint is read once, here, before LightningCLI rebuilds the model from its hyperparameters
        self.resumed = resolve_checkpoint(subcommand, config)
        if self.resumed is not None:
            model = config.get("model") or Namespace()
            check_checkpoint_model(self.resumed[1], self.resumed[0], model.get("class_path"))
            check_model_flags(argv, model.get("init_args"), self.resumed[1], self.resumed[0])
        if config.get("seed_everything") is True:
            config["seed_everything"] = shared_random_seed()

    def _parse_with_the_chosen_classes_defaults(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse so that ``--model=X`` / ``--data=Y`` start from their own defaults, not the init_args the default
        config's class shares with them by name (jsonargparse keeps those): parse again without that section."""
        argv = list(sys.argv[1:] if args is None else args) if isinstance(args, (list, tuple, type(None))) else None
        if argv is None:
            super().parse_arguments(parser, args)
            return
        printing = [a for a in argv if str(a).startswith("--print_config")]
        with warnings.catch_warnings():
            # the arguments are sys.argv's, passed on explicitly to be parsed twice
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            super().parse_arguments(parser, [a for a in argv if a not in printing])
            rebased = self._rebased_arguments(argv)
            if rebased is not None or printing:
                super().parse_arguments(parser, rebased if rebased is not None else argv)

    def _rebased_arguments(self, argv: list[str]) -> list[str] | None:
        subcommand = self.config.get("subcommand")  # None with run=False: one parser, options at the top level
        if subcommand is not None and subcommand not in argv:
            return None
        config = self.config[subcommand] if subcommand is not None else self.config
        defaults = yaml.safe_load(DEFAULT_CONFIG.read_text()) or {}
        chosen = {key: config[key].get("class_path") for key in ("model", "data")}
        changed = [
            key
            for key, class_path in chosen.items()
            if isinstance(defaults.get(key), dict)
            and import_class(str(class_path)) is not import_class(defaults[key]["class_path"])
        ]
        if not changed:
            return None
        # the default config file is replaced by the same file without those sections
        skip_default_config_files(self, subcommand)
        base = yaml.safe_dump({key: value for key, value in defaults.items() if key not in changed})
        at = argv.index(subcommand) + 1 if subcommand is not None else 0
        return [*argv[:at], "--config", base, *(f"--{key}={chosen[key]}" for key in changed), *argv[at:]]

    @staticmethod
    def _global_batch_size(config: Namespace) -> int | None:
        data = config.get("data")
        if not isinstance(data, Namespace) or "class_path" not in data:
            return None
        data_class = import_class(data.class_path)
        if data_class is None or not issubclass(data_class, GlobalBatchDataModule):
            return None  # only our data modules promise a global batch size
        return data.get("init_args", Namespace()).get("batch_size")

    # -- run directory: loggers and wandb ----------------------------------------------------------------------

    def before_instantiate_classes(self) -> None:
        trainer = self._chosen().trainer
        run_dir = trainer.get("default_root_dir") or os.getcwd()
        loggers = trainer.get("logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            if not isinstance(logger, Namespace) or "class_path" not in logger:
                continue
            if logger.get("init_args") is None:
                logger["init_args"] = Namespace()
            init_args = logger.init_args
            if init_args.get("save_dir") in UNSET_SAVE_DIRS:
                init_args["save_dir"] = run_dir
            if logger.class_path.endswith("WandbLogger") and init_args.get("id") is None:
                init_args["id"] = _stable_wandb_id(run_dir)

    def instantiate_classes(self) -> None:
        # building the objects the config names is the boundary where any exception is a bad value in the config
        try:
            super().instantiate_classes()
        except Exception as error:
            raise self._building_error(error) from error
        if self.subcommand is None:
            return
        check_optimizer(self.model)
        check_sequence_length(self.model, self.datamodule)
        if self.subcommand == "fit":  # Lightning converts BatchNorm to SyncBatchNorm for fitting only
            sync = self.config[self.subcommand].trainer.get("sync_batchnorm")
            check_sync_batchnorm(self.model, self.trainer, bool(sync))
        if self.resumed is not None:
            check_checkpoint_fits(self.model, self.resumed[1], self.resumed[0])
            self.resumed = None  # checked: the memory-mapped file is Lightning's to read now

    def _building_error(self, error: Exception) -> ConfigurationError:
        """One paragraph for an exception raised while LightningCLI built the objects of the config."""
        known = user_error_of(error)  # e.g. a constructor that downloads: no network, not a wrong option
        if known is not None:
            return known
        if getattr(self, "config_init", None) is None:  # jsonargparse builds the model, data, callbacks and loggers
            chosen = {key: self._chosen().get(key) for key in ("model", "data")}
            named = [
                f"--{k}={c.class_path}" for k, c in chosen.items() if isinstance(c, Namespace) and "class_path" in c
            ]
            what = f"the objects of the config ({', '.join(named)}, the callbacks and loggers)"
        else:
            what = "the Trainer from the --trainer options"
        return ConfigurationError(
            f"building {what} failed: {describe(causes(error)[-1])}. Fix: correct the option this names (`{PROG} fit"
            f" --help` lists them, `--model.help CLASS` and `--data.help CLASS` a class's); set {DEBUG_ENV}=true to"
            " see the traceback."
        )

    def fit(self, **kwargs: Any) -> None:
        """``trainer.fit``; under ``ddp_spawn`` the launching process passes stop signals on to its workers."""
        with forward_stop_signals_to_workers(self.config[self.subcommand].trainer.get("strategy")):
            self.trainer.fit(**kwargs)

    def _chosen(self, config: Namespace | None = None) -> Namespace:
        """The options of this run's subcommand (all options, where the CLI runs without subcommands)."""
        config = self.config if config is None else config
        return config[self.subcommand] if self.subcommand else config

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """The Trainer, built once with everything the template adds: its callbacks in one list, in the order
        ``src/callbacks/__init__.py`` gives, the strategy's options and the checkpoint plugins."""
        built = self._chosen(self.config_init)  # the objects the parser instantiated
        trainer_config = built.get("trainer") or {}
        chosen = self._chosen()
        off = set(chosen.get("callbacks_off") or [])
        callbacks = trainer_config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        bar = None if "progress_bar" in off else progress_bar(chosen.get("progress_bar", "auto"))
        if trainer_config.get("enable_progress_bar") is not False and not any(
            isinstance(c, ProgressBar) for c in callbacks
        ):
            if bar is None:
                kwargs["enable_progress_bar"] = False
            else:
                callbacks.append(bar)
        summary = trainer_config.get("enable_model_summary") is not False and not trainer_config.get("barebones")
        if "model_summary" in off:
            kwargs["enable_model_summary"] = False
        elif summary and not any(isinstance(c, ModelSummary) for c in callbacks):
            callbacks.append(FlopsAwareModelSummary())  # no column of zero FLOPs (src/callbacks/summary.py)
            kwargs["enable_model_summary"] = False  # Lightning's own is replaced (else it logs that it skips it)
        if chosen.get("compile"):
            callbacks.append(CompileModel())
        strategy = _strategy_name(trainer_config)
        options = _strategy_options(strategy, chosen.get("collective_timeout"), self.model)
        if options:
            kwargs["strategy"] = strategy  # `auto` as `ddp`, where Lightning picks it
        if isinstance(strategy, ModelParallelStrategy) and not isinstance(strategy, TEMPLATE_MODEL_PARALLEL):
            callbacks.append(ClipAcrossMeshes())  # e.g. Lightning's class, given as a class_path: torch's clipping
        callbacks += [ExactContinuation(), RandomState()]
        max_time = trainer_config.get("max_time")
        if max_time is not None and not any(isinstance(c, Timer) for c in callbacks):
            # the same limit, stopping at a step boundary without an extra validation (src/callbacks/continuation.py)
            callbacks.append(RunTimer(duration=max_time))
            kwargs["max_time"] = None
        if trainer_config.get("enable_checkpointing") is False:
            off.add("checkpoint")  # the Trainer refuses a ModelCheckpoint when checkpointing is off
        elif "checkpoint" in off:
            kwargs["enable_checkpointing"] = False  # else Lightning adds a ModelCheckpoint of its own
        callbacks += [built[key] for key in CALLBACK_OPTIONS if key not in off]
        # each a no-op where it does not apply (one process; a precision other than 64-true or a "-true" one)
        callbacks += [PrecisionBeforeRestore(), Float64Metrics()]
        callbacks += [StopOtherRanksOnError(), UnshareSpawnedTensors(), DestroyProcessGroupAtExit()]
        kwargs["plugins"] = _with_atomic_checkpoints(trainer_config.get("plugins"), slurm_requeue="preemption" in off)
        with registered_with(strategy, options):
            return super().instantiate_trainer(callbacks=callbacks, **kwargs)


def _strategy_name(trainer: Namespace | dict[str, Any]) -> Any:
    """``--trainer.strategy``, with ``auto`` named ``ddp`` where Lightning picks it (several processes), so that
    such a run gets the template's collective timeout and DDP options too."""
    strategy = trainer.get("strategy")
    if strategy != "auto" or hasattr(sys, "ps1") or sys.flags.interactive:  # a notebook: Lightning forks there
        return strategy
    devices = requested_devices(trainer.get("devices", "auto"), resolve_accelerator(trainer.get("accelerator", "auto")))
    many = (devices or 1) > 1 or (trainer.get("num_nodes") or 1) > 1
    return "ddp" if many else strategy


def _strategy_as_class(trainer: Namespace) -> None:
    """``--trainer.strategy=package.module.Class`` as that class with its defaults, as a ``class_path`` is: the option
    also takes a name, so jsonargparse keeps the string, which Lightning would refuse as an unknown name."""
    strategy = trainer.get("strategy")
    if not isinstance(strategy, str) or "." not in strategy or strategy.lower() in StrategyRegistry:
        return
    named = import_class(strategy)
    if isinstance(named, type) and issubclass(named, Strategy):
        trainer["strategy"] = Namespace(class_path=strategy)


def _strategy_options(strategy: Any, seconds: float | None, model: L.LightningModule) -> dict[str, Any]:
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


def _with_atomic_checkpoints(plugins: Any, slurm_requeue: bool = False) -> list[Any]:
    """The user's ``--trainer.plugins`` with atomic checkpoint saving (``src/checkpoints/files.py``); under SLURM
    without Lightning's save-and-requeue in its signal handler unless ``slurm_requeue`` (preemption off)."""
    plugins = with_atomic_io(plugins)
    # the environment Lightning would pick itself, with one switch changed: SLURM's, unless torchrun started the
    # processes (Lightning detects TorchElastic first, since torchrun also runs inside SLURM jobs)
    slurm = SLURMEnvironment.detect() and not TorchElasticEnvironment.detect()
    if not slurm_requeue and slurm and not any(isinstance(p, ClusterEnvironment) for p in plugins):
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return plugins


def main(args: list[str] | None = None) -> None:
    """Entry point; exits with status 2 on a configuration error and with ``TrainingStopped.exit_code`` after a
    stop (75, 130 or 143 after a signal, 65 on a non-finite loss)."""
    # NCCL: a failed or timed-out collective aborts the process instead of leaving the other ranks waiting
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    try:
        TemplateCLI(args=args)
    except TrainingStopped as stop:  # a signal (saved, resumable) or a non-finite loss
        rank = rank_zero_only.rank
        print(f"{stop.label}: {f'(rank {rank}) ' if rank else ''}{stop}", file=sys.stderr)  # each rank's own stop
        sys.exit(stop.exit_code)
    except ProcessExitedException as worker:
        if worker.exit_code not in STOP_EXIT_CODES:
            sys.exit(report(worker))  # a worker died: one line, not torch.multiprocessing's traceback
        sys.exit(worker.exit_code)  # ddp_spawn workers saved and stopped on a signal; rank 0 printed why
    except Exception as error:
        sys.exit(report(error))  # one paragraph for a configuration error; other errors keep their traceback


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__":
    # a ddp_spawn worker: multiprocessing runs this module under that name instead of calling main()
    silence_known_noise()
