"""The command line: ``python -m src.cli {fit,validate,test,predict,tune} [--config FILE ...] [--key=value ...]``.

Every option of the Trainer, the model, the data module, the optimizer and the LR scheduler comes from
LightningCLI: on the command line, in YAML (``--config``, several compose), from environment variables
(``PL_FIT__TRAINER__MAX_STEPS=100``), and listed by ``--help``, ``--model.help CLASS`` and ``--data.help CLASS``.
Arguments apply in order and a later one wins: a ``--config`` file overrides the flags before it, so config files
go first. ``configs/default.yaml`` is read before everything (a bare ``python -m src.cli fit`` trains the embedded
image workload), then environment variables, then the arguments. Model and data are chosen by class path:
``--model=my_pkg.MyModel --data=my_pkg.MyData``.

On top of LightningCLI this adds, before anything starts: a check of the launch (strategy name, device count,
presets this machine cannot run, nodes, SLURM allocation, batch divisibility, checkpoint files, SyncBatchNorm)
that fails with one clear message; loggers that write under the run directory (``--trainer.default_root_dir``); a
stable wandb run id per run directory; checkpoints in ``<run dir>/checkpoints``; preemption handling; and the
``dp`` strategy.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import uuid
import warnings
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, NoReturn

import lightning as L
import torch
import yaml
from jsonargparse import ActionConfigFile, Namespace
from jsonargparse._common import debug_mode_active
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, Timer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins import DoublePrecision, HalfPrecision
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from torch.multiprocessing import ProcessExitedException

from src.callbacks import NonFiniteLossGuard, PreemptionCheckpoint, RunCheckpoint, RunPlan, SpeedMonitor, progress_bar
from src.callbacks.compile import CompileModel
from src.callbacks.continuation import ExactContinuation, RunTimer
from src.callbacks.precision import Float64Metrics
from src.callbacks.preemption import STOP_EXIT_CODES, forward_stop_signals_to_workers
from src.callbacks.process_group import DestroyProcessGroupAtExit
from src.callbacks.spawn import UnshareSpawnedTensors
from src.callbacks.summary import ModelSummary as FlopsAwareModelSummary
from src.checkpoint_io import AtomicCheckpointIO, is_intact, newest_intact_checkpoint
from src.checks import (
    check_checkpoint_fits,
    check_checkpoint_model,
    check_launch,
    check_optimizer,
    check_sequence_length,
    check_sync_batchnorm,
    yaml_problem,
)
from src.data.base import GlobalBatchDataModule
from src.errors import (
    MAIN_PID_ENV,
    ConfigurationError,
    StopOtherRanksOnError,
    TrainingStopped,
    building_error,
    notice,
    report,
)
from src.quiet import silence_known_noise
from src.sharded_checkpoint import is_sharded_checkpoint, restore_interrupted
from src.strategies import register_dp_strategy, register_model_parallel_strategies
from src.tuning import Trainer as TuningTrainer

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict", "tune")
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")
UNSET_SAVE_DIRS = (None, "", ".")
WANDB_ID_FILE = "wandb_run_id"
#: a collective that waits longer fails the job: long enough for checkpointing and validation, short enough
#: that a dead rank does not hold the others for Lightning's default of 30 minutes
COLLECTIVE_TIMEOUT_S = 900.0


def checkpoint_dir(run_dir: str | None) -> str:
    """Where ``ModelCheckpoint`` and preemption save: ``<run dir>/checkpoints``, stable across restarts."""
    return os.path.join(run_dir or os.getcwd(), "checkpoints")


def _import(class_path: str) -> type | None:
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(__import__(module_name, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return None


def _loggers(trainer: Namespace) -> list[Namespace]:
    logger = trainer.get("logger")
    loggers = logger if isinstance(logger, list) else [logger]
    return [entry for entry in loggers if isinstance(entry, Namespace) and "class_path" in entry]


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


def _check_checkpoint_file(path: Path, option: str) -> None:
    if is_sharded_checkpoint(path):  # a folder of shards (fsdp2, tensor_parallel), complete
        return
    if not path.is_file():
        raise ConfigurationError(
            f"{option}={path} does not exist. Fix: give the path of a .ckpt file, or 'last' / 'best'."
        )
    # torch.save writes a zip archive; a truncated or overwritten file has no valid central directory
    if not zipfile.is_zipfile(path):
        raise ConfigurationError(
            f"{option}={path} is not a readable checkpoint (truncated or corrupt, {path.stat().st_size} bytes)."
            " Fix: pass an earlier checkpoint from the same folder, e.g. a best-*.ckpt file; the file is left as is."
        )


def shared_random_seed() -> int:
    """The seed ``seed_everything: true`` draws, the same on every process of one launch.

    Each process of a SLURM or torchrun job runs the command itself, so a seed drawn per process would give
    every rank its own data order. Processes started by Lightning (``ddp``, ``ddp_spawn``) inherit the seed
    of the first one (``PL_GLOBAL_SEED``); processes of one job derive it from the job's id, which is also kept
    by a requeued job. Anything else draws a fresh one.
    """
    if "PL_GLOBAL_SEED" in os.environ:
        return int(os.environ["PL_GLOBAL_SEED"])
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if job_id != "none":
        return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "little")
    return random.SystemRandom().randrange(2**32)


def _resolved_checkpoint(config: Namespace) -> Path | None:
    """The file ``--ckpt_path`` names (``last`` resolved in the run directory), or None."""
    ckpt_path = config.get("ckpt_path")
    if ckpt_path is None or "://" in str(ckpt_path) or ckpt_path in ("best", "hpc", "registry"):
        return None
    if ckpt_path == "last":
        folder = Path(checkpoint_dir(config.trainer.get("default_root_dir")))
        candidates = sorted(folder.glob("last*.ckpt"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
        return candidates[-1] if candidates else None
    return Path(ckpt_path)


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _check_model_flags_match_checkpoint(args: Any, config: Namespace) -> None:
    """Refuse a ``--model.*`` flag that differs from the hyperparameters saved in the ``--ckpt_path`` checkpoint.

    LightningCLI rebuilds the model from the checkpoint's hyperparameters, so such a flag would be dropped
    without a word (a run trained with ``n_embd=128`` would continue at 128 under ``--model.init_args.n_embd=64``).
    """
    path = _resolved_checkpoint(config)
    if not isinstance(args, (list, tuple)) or path is None or not path.is_file():
        return
    flags = [str(a).split("=", 1)[0] for a in args if str(a).startswith("--model.")]
    if not flags:
        return
    model = config.get("model")
    init_args = model.get("init_args") if isinstance(model, Namespace) else None
    if not isinstance(init_args, Namespace):
        return
    hparams = torch.load(path, map_location="cpu", weights_only=True).get("hyper_parameters") or {}
    for flag in flags:
        name = flag.removeprefix("--model.").removeprefix("init_args.").split(".")[0]
        if name not in hparams or name not in init_args:
            continue
        given, saved = _plain(init_args[name]), _plain(hparams[name])
        if given != saved:
            raise ConfigurationError(
                f"{flag}={given} differs from the checkpoint it resumes, {path}, which was trained with"
                f" {name}={saved}; the model is rebuilt from the checkpoint's hyperparameters, so the flag would be"
                f" ignored. Fix: drop {flag} to continue the checkpoint's model, or train a new model at {given}"
                " without --ckpt_path in another --trainer.default_root_dir. Nothing was changed."
            )


class TemplateArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with short errors: the message and where to look, not the 150-line usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--trainer.max_epoch` must not silently mean max_epochs
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Namespace:
        # jsonargparse reports a YAML syntax error without the file's name; name it, with the line
        problem = yaml_problem(sys.argv[1:] if args is None else args)
        if problem is not None and self.exit_on_error and not debug_mode_active():
            sys.stderr.write(f"error: {problem}\n")
            self.exit(2)
        return super().parse_args(args, *rest, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debug_mode_active():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        # keep the lines that say what is wrong; drop jsonargparse's internals (the None alternative, NestedArg)
        noise = ("Subtypes:", "Expected a <class 'NoneType'>", "Given value type:", "Given value: NestedArg")
        noise += ("Does not validate against any of the Union subtypes", "Errors:")
        lines = message.strip().splitlines()
        message = " ".join(line.strip() for line in lines if not line.strip().lstrip("- ").startswith(noise))
        command = parser.prog.replace(" [options]", "")
        sys.stderr.write(
            f"error: {message}\n"
            f"Fix: correct that option. `{command} --help` lists every option; `--model.help CLASS` and"
            " `--data.help CLASS` list a model's or data module's.\n"
        )
        self.exit(2)


class TemplateCLI(LightningCLI):
    """LightningCLI with this template's defaults, checks and run-directory layout (see the module docstring)."""

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
            parser_kwargs={"prog": "python -m src.cli", **(per_subcommand if not run else {"default_env": True})}
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
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
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
        parser.add_lightning_class_args(PreemptionCheckpoint, "preemption")
        parser.add_lightning_class_args(SpeedMonitor, "throughput")
        parser.add_lightning_class_args(RunPlan, "run_plan")
        parser.add_lightning_class_args(NonFiniteLossGuard, "nan_guard")
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
            " ddp_spawn; checkpoints keep their keys. For a mode or backend, add src.callbacks.compile.CompileModel"
            " to --trainer.callbacks instead.",
        )
        parser.add_argument(
            "--collective_timeout",
            type=float,
            default=COLLECTIVE_TIMEOUT_S,
            help="Seconds a ddp / ddp_spawn collective waits for the other ranks before the job fails, so that a"
            " stuck or dead rank cannot hang the job. Raise it if rank 0 alone does long work (a download).",
        )

    # -- checks before anything is instantiated --------------------------------------------------------------

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        self._parse_with_the_chosen_classes_defaults(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        config = self.config[subcommand]
        argv = sys.argv[1:] if args is None else args
        check_launch(config.trainer.as_dict(), batch_size=self._global_batch_size(config), args=argv)
        self._check_ckpt_path(subcommand, config)
        checkpoint = _resolved_checkpoint(config)
        if checkpoint is not None and checkpoint.is_file():  # before LightningCLI reads its hyperparameters
            check_checkpoint_model(checkpoint, config.model.get("class_path") if "model" in config else None)
        _check_model_flags_match_checkpoint(argv, config)
        if config.get("seed_everything") is True:
            config["seed_everything"] = shared_random_seed()
        if config.trainer.get("enable_checkpointing") is False:
            # the Trainer refuses a ModelCheckpoint when checkpointing is off: leave `--checkpoint` out
            self._parser(subcommand).callback_keys.remove("checkpoint")

    def _parse_with_the_chosen_classes_defaults(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse so that ``--model=X`` / ``--data=Y`` start from X's and Y's own defaults.

        jsonargparse keeps the init_args of the previous class that the new one shares by name, so the default
        config's image workload would leak into any model or data module chosen on top of it (its
        ``batch_size: 128``, CIFAR's ``val_size: 5000``, ``num_classes: 10``). When the chosen class differs from
        the default config's, the arguments are parsed again on the default config without that section.
        """
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
            and _import(str(class_path)) is not _import(defaults[key]["class_path"])
        ]
        if not changed:
            return None
        self._parser(subcommand).default_config_files = []  # replaced by the same file without those sections
        base = yaml.safe_dump({key: value for key, value in defaults.items() if key not in changed})
        at = argv.index(subcommand) + 1 if subcommand is not None else 0
        return [*argv[:at], "--config", base, *(f"--{key}={chosen[key]}" for key in changed), *argv[at:]]

    @staticmethod
    def _global_batch_size(config: Namespace) -> int | None:
        data = config.get("data")
        if not isinstance(data, Namespace) or "class_path" not in data:
            return None
        data_class = _import(data.class_path)
        if data_class is None or not issubclass(data_class, GlobalBatchDataModule):
            return None  # only our data modules promise a global batch size
        return data.get("init_args", Namespace()).get("batch_size")

    @staticmethod
    def _check_ckpt_path(subcommand: str, config: Namespace) -> None:
        ckpt_path = config.get("ckpt_path")
        run_dir = config.trainer.get("default_root_dir")
        folder = Path(checkpoint_dir(run_dir))
        if ckpt_path is None:
            existing = sorted(folder.glob("*.ckpt")) if folder.is_dir() else []
            if subcommand == "fit" and existing:
                raise ConfigurationError(
                    f"--trainer.default_root_dir={run_dir} already holds a run ({len(existing)} checkpoint(s) in"
                    f" {folder}). Fix: resume it with --ckpt_path=last, or start a new run in another directory"
                    " with --trainer.default_root_dir=<new dir>; nothing was changed."
                )
            return
        if ckpt_path == "last":
            restore_interrupted(folder)  # a sharded checkpoint a kill left aside while replacing it
            candidates = sorted(folder.glob("last*.ckpt"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
            if candidates and not is_intact(candidates[-1]):
                # a requeued job must not stop on a damaged file: continue from the newest intact checkpoint
                fallback = newest_intact_checkpoint(folder, skip=candidates[-1])
                if fallback is None:
                    _check_checkpoint_file(candidates[-1], "--ckpt_path=last resolved to")
                    raise ConfigurationError(
                        f"--ckpt_path=last: {candidates[-1]} is damaged and {folder} holds no intact checkpoint."
                        " Fix: start a new run without --ckpt_path in another --trainer.default_root_dir."
                    )
                notice(
                    f"--ckpt_path=last: {candidates[-1]} is damaged (truncated or corrupt); resuming from the newest"
                    f" intact checkpoint, {fallback}, instead. The damaged file is left as it is."
                )
                config["ckpt_path"] = str(fallback)
            return
        if ckpt_path in SPECIAL_CKPT_PATHS or "://" in str(ckpt_path):
            return
        _check_checkpoint_file(Path(ckpt_path), "--ckpt_path")

    # -- run directory: loggers and wandb ----------------------------------------------------------------------

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        run_dir = config.trainer.get("default_root_dir") or os.getcwd()
        for logger in _loggers(config.trainer):
            if logger.get("init_args") is None:
                logger["init_args"] = Namespace()
            init_args = logger.init_args
            if init_args.get("save_dir") in UNSET_SAVE_DIRS:
                init_args["save_dir"] = run_dir
            if logger.class_path.endswith("WandbLogger") and init_args.get("id") is None:
                init_args["id"] = _stable_wandb_id(run_dir)

    def instantiate_classes(self) -> None:
        # an exception while building the objects is a bad value in the config: report it as one (src/errors.py)
        try:
            super().instantiate_classes()
        except Exception as error:
            raise building_error(error) from error
        if self.trainer.world_size > 1:  # one process has no other ranks to stop (and no hooks to pay for)
            self.trainer.callbacks.append(StopOtherRanksOnError())
            # ddp_spawn workers would otherwise add into one shared copy of each metric state (src/callbacks/spawn.py)
            self.trainer.callbacks.append(UnshareSpawnedTensors())
            # gloo can abort a rank at interpreter exit if its process group is still alive (process_group.py)
            self.trainer.callbacks.append(DestroyProcessGroupAtExit())
        if self.subcommand is None:
            return
        check_optimizer(self.model)
        check_sequence_length(self.model, self.datamodule)
        if self.subcommand == "fit":  # Lightning converts BatchNorm to SyncBatchNorm for fitting only
            sync = self.config[self.subcommand].trainer.get("sync_batchnorm")
            check_sync_batchnorm(self.model, self.trainer, bool(sync))
        checkpoint = _resolved_checkpoint(self.config[self.subcommand])
        if checkpoint is not None and checkpoint.is_file():
            check_checkpoint_fits(self.model, checkpoint)

    def before_fit(self) -> None:
        # Manual optimization backpropagates one network at a time (a GAN's discriminator, then its generator),
        # so DDP must expect parameters without a gradient in each backward, or it stops at the second one.
        # `_ddp_kwargs` (private) is where DDPStrategy keeps them until it wraps the model; the zoo's GAN under
        # ddp (tests/test_zoo.py) fails if Lightning changes that.
        strategy = self.trainer.strategy
        if not self.model.automatic_optimization and isinstance(strategy, DDPStrategy):
            strategy._ddp_kwargs.setdefault("find_unused_parameters", True)

    def fit(self, **kwargs: Any) -> None:
        """``trainer.fit``; under ``ddp_spawn`` the launching process passes stop signals on to its workers."""
        with forward_stop_signals_to_workers(self._get(self.config, "trainer", default=Namespace()).get("strategy")):
            self.trainer.fit(**kwargs)

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = trainer_config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        if trainer_config.get("enable_progress_bar") is not False and not any(
            isinstance(c, ProgressBar) for c in callbacks
        ):
            bar = progress_bar(self._get(self.config, "progress_bar", default="auto"))
            if bar is None:
                kwargs["enable_progress_bar"] = False
            else:
                callbacks.append(bar)
        summary = trainer_config.get("enable_model_summary") is not False and not trainer_config.get("barebones")
        if summary and not any(isinstance(c, ModelSummary) for c in callbacks):
            callbacks.append(FlopsAwareModelSummary())  # no column of zero FLOPs (src/callbacks/summary.py)
            kwargs["enable_model_summary"] = False  # Lightning's own is replaced (else it logs that it skips it)
        if self._get(self.config, "compile", default=False):
            callbacks.append(CompileModel())
        callbacks.append(ExactContinuation())
        max_time = trainer_config.get("max_time")
        if max_time is not None and not any(isinstance(c, Timer) for c in callbacks):
            # the same limit, stopping at a step boundary without an extra validation (src/callbacks/continuation.py)
            callbacks.append(RunTimer(duration=max_time))
            kwargs["max_time"] = None
        kwargs["plugins"] = _with_atomic_checkpoints(trainer_config.get("plugins"))
        timeout = self._get(self.config, "collective_timeout", default=None)
        kwargs.update(_strategy_with_timeout(trainer_config.get("strategy"), timeout))
        trainer = super().instantiate_trainer(callbacks=callbacks, **kwargs)
        if isinstance(trainer.precision_plugin, (DoublePrecision, HalfPrecision)):
            # Lightning loads a checkpoint's weights before it converts the module to a "-true" precision, so
            # float64 weights would be rounded through float32 on resume: convert first (the later one is a no-op)
            trainer.precision_plugin.convert_module(self.model)
        if isinstance(trainer.precision_plugin, DoublePrecision):
            trainer.callbacks.append(Float64Metrics())  # fp64 metric sums too, equal to 1e-12 at any world size
        return trainer


def _strategy_with_timeout(strategy: Any, seconds: float | None) -> dict[str, Any]:
    """``{"strategy": DDPStrategy(timeout=...)}`` for a ddp-family strategy given by name; else nothing."""
    if not isinstance(strategy, str) or seconds is None or strategy not in StrategyRegistry:
        return {}
    entry = StrategyRegistry[strategy]
    if not issubclass(entry["strategy"], DDPStrategy):
        return {}
    return {"strategy": entry["strategy"](**entry["init_params"], timeout=timedelta(seconds=seconds))}


def _with_atomic_checkpoints(plugins: Any) -> list[Any]:
    """The user's ``--trainer.plugins``, plus atomic checkpoint saving unless they chose a ``CheckpointIO``."""
    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
        plugins.append(AtomicCheckpointIO())
    return plugins


def main(args: list[str] | None = None) -> None:
    """Entry point; exits with status 2 on a configuration error and with ``TrainingStopped.exit_code`` after a
    stop (75, 130 or 143 after a signal, 65 on a non-finite loss)."""
    if "LOCAL_RANK" not in os.environ or os.environ.get(MAIN_PID_ENV) != str(os.getppid()):
        # the first process of this launch (torchrun and srun start every rank): the ranks that Lightning's
        # ddp launcher starts from it inherit its pid, so that they let it report an error they share
        os.environ[MAIN_PID_ENV] = str(os.getpid())
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
