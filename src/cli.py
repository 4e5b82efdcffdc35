"""The command line: ``python -m src.cli {fit,validate,test,predict} [--config FILE ...] [--key=value ...]``.

Every option of the Trainer, the model, the data module, the optimizer and the LR scheduler comes from
LightningCLI: on the command line, in YAML (``--config``, several compose, last wins), from environment
variables (``PL_FIT__TRAINER__MAX_STEPS=100``), and listed by ``--help``, ``--model.help CLASS`` and
``--data.help CLASS``. ``configs/default.yaml`` is read first, so a bare ``python -m src.cli fit`` trains the
embedded image workload. Model and data are chosen by class path: ``--model=my_pkg.MyModel --data=my_pkg.MyData``.

On top of LightningCLI this adds, before anything starts: a check of the launch (strategy name, device count,
SLURM allocation, batch divisibility, checkpoint files) that fails with one clear message; loggers that write
under the run directory (``--trainer.default_root_dir``); a stable wandb run id per run directory; checkpoints
in ``<run dir>/checkpoints``; preemption handling; and the ``dp`` strategy.
"""

from __future__ import annotations

import os
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any, Literal, NoReturn

import lightning as L
from jsonargparse import Namespace
from jsonargparse._common import debug_mode_active
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from src.callbacks import PreemptionCheckpoint, RunCheckpoint, progress_bar
from src.checks import check_launch
from src.data.base import GlobalBatchDataModule
from src.errors import ConfigurationError, Preempted
from src.strategies import register_dp_strategy

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict")
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")
UNSET_SAVE_DIRS = (None, "", ".")
WANDB_ID_FILE = "wandb_run_id"


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


class TemplateArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with short errors: the message and where to look, not the 150-line usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--trainer.max_epoch` must not silently mean max_epochs
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debug_mode_active():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        # keep the lines that say what is wrong; drop jsonargparse's internals (the None alternative, NestedArg)
        noise = ("Subtypes:", "Expected a <class 'NoneType'>", "Given value type:", "Given value: NestedArg")
        lines = message.strip().splitlines()
        message = "\n".join(line for line in lines if not line.strip().lstrip("- ").startswith(noise))
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
        register_dp_strategy()
        per_subcommand = {"default_config_files": [str(DEFAULT_CONFIG)], "default_env": True}
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
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
        parser.add_argument(
            "--progress_bar",
            type=Literal["auto", "rich", "plain", "none"],
            default="auto",
            help="Progress output: auto (Rich on a terminal, plain lines otherwise), rich, plain or none.",
        )

    # -- checks before anything is instantiated --------------------------------------------------------------

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        config = self.config[subcommand]
        check_launch(config.trainer.as_dict(), batch_size=self._global_batch_size(config))
        self._check_ckpt_path(subcommand, config)

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
            candidates = sorted(folder.glob("last*.ckpt"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
            if candidates:
                _check_checkpoint_file(candidates[-1], "--ckpt_path=last resolved to")
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
        return super().instantiate_trainer(callbacks=callbacks, **kwargs)


def main(args: list[str] | None = None) -> None:
    """Entry point; exits with status 2 on a configuration error and with ``Preempted.exit_code`` after a stop."""
    try:
        TemplateCLI(args=args)
    except ConfigurationError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except Preempted as stop:
        print(f"preempted: {stop}", file=sys.stderr)
        sys.exit(stop.exit_code)


if __name__ == "__main__":
    main()
