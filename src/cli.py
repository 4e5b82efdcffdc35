"""The command line: ``python -m src.cli {fit,validate,test,predict,tune} [--config FILE ...] [--key=value ...]``.

Every option comes from LightningCLI (README "The command line"); ``configs/default.yaml`` is read first. A run
goes, top to bottom in ``TemplateCLI``: parse (the template's options from ``src/options.py``), check before
anything is built (``src/checks.py``; the checkpoint resolved and read once, ``src/checkpoints/resume.py``), build
the objects (loggers placed in the run directory, ``src/run_dir.py``) and then the Trainer, once, with everything
the template adds (callbacks, ``src/callbacks/__init__.py``; strategy options and plugins, ``src/launch.py``),
and run the subcommand.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from torch.multiprocessing import ProcessExitedException

from src.callbacks import template_callbacks
from src.callbacks.preemption import STOP_EXIT_CODES, forward_stop_signals_to_workers
from src.checkpoints.resume import resolve_checkpoint
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
    load_config_file,
    process_count,
)
from src.compat import registered_with, skip_default_config_files
from src.data.base import GlobalBatchDataModule
from src.errors import DEBUG_ENV, ConfigurationError, TrainingStopped, causes, describe, report, user_error_of
from src.launch import (
    checkpoint_plugins,
    flight_recorder_defaults,
    strategy_as_class,
    strategy_name,
    strategy_options,
)
from src.options import (
    CLASSES,
    PROG,
    TemplateArgumentParser,
    add_config_option,
    add_template_options,
    chosen_classes,
    rebased_arguments,
)
from src.quiet import silence_known_noise
from src.run_dir import place_loggers, shared_random_seed
from src.strategies import register_dp_strategy, register_model_parallel_strategies, register_pipeline_strategy
from src.strategies.pipeline import PipelineOptions, PipelineStrategy, check_pipeline, check_stages
from src.tuning import Trainer as TuningTrainer

__all__ = ["DEFAULT_CONFIG", "TemplateCLI", "main", "shared_random_seed"]

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict", "tune")


class TemplateCLI(LightningCLI):
    """LightningCLI with this template's defaults, checks and run-directory layout (see the module docstring)."""

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        #: the ``--ckpt_path`` file and its contents, read once before launch for the checks
        self.resumed: tuple[Path, dict[str, Any]] | None = None
        self.runs_a_subcommand = run  # run=False: one parser, the options at the top level
        silence_known_noise()  # src/quiet.py: the lines every run printed that say nothing about the run
        register_dp_strategy()
        register_model_parallel_strategies()
        register_pipeline_strategy()
        per_subcommand = {"default_config_files": [str(DEFAULT_CONFIG)], "default_env": True}
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        #: a trainer_class given here runs every subcommand; else only `tune` builds src/tuning's Trainer
        self.chosen_trainer_class = kwargs.get("trainer_class")
        # the parser takes `tune`'s options from this class's `tune` method, as fit's from Trainer.fit
        kwargs.setdefault("trainer_class", TuningTrainer)
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
        add_config_option(parser)
        return parser

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # `tune` takes its options from TuningTrainer.tune's arguments, as fit does from Trainer.fit's
        return {**LightningCLI.subcommands(), "tune": {"model", "datamodule"}}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        add_template_options(parser)

    # -- checks before anything is instantiated --------------------------------------------------------------

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        self._parse_with_the_chosen_classes_defaults(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand != "tune" and self.chosen_trainer_class is None:
            self.trainer_class = L.Trainer  # fit, validate, test and predict run on Lightning's own Trainer
        strategy_as_class(self.config[subcommand].trainer if subcommand is not None else self.config.trainer)
        if subcommand is None:
            return
        config = self.config[subcommand]
        argv = sys.argv[1:] if args is None else args
        check_launch(config.trainer.as_dict(), batch_size=self._global_batch_size(config), args=argv)
        if config.get("compile"):  # before the strategy's own checks: what it refuses is the strategy itself
            check_compile(config.trainer.get("strategy"))
        if strategy_name(config.trainer.as_dict()) == PipelineStrategy.strategy_name:
            model = import_class(str((config.get("model") or Namespace()).get("class_path")))
            accumulate = int(config.trainer.get("accumulate_grad_batches") or 1)
            options, processes = PipelineOptions(**config.pipeline.as_dict()), process_count(config.trainer.as_dict())
            check_pipeline(options, processes, model, self._global_batch_size(config), accumulate)
        # the checkpoint is read once, here, before LightningCLI rebuilds the model from its hyperparameters
        self.resumed = resolve_checkpoint(subcommand, config)
        if self.resumed is not None:
            model = config.get("model") or Namespace()
            check_checkpoint_model(self.resumed[1], self.resumed[0], model.get("class_path"))
            check_model_flags(argv, model.get("init_args"), self.resumed[1], self.resumed[0])
        if config.get("seed_everything") is True:
            config["seed_everything"] = shared_random_seed()

    def _parse_with_the_chosen_classes_defaults(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse once, so that ``--model=X`` / ``--data=Y`` start from their own defaults, not the init_args that the
        default config's class shares with them by name (jsonargparse keeps those).

        The classes are read from the arguments before parsing (``--model``, ``--model.class_path`` and the
        ``--config`` files, the last one winning, as jsonargparse takes them); where one differs from the default
        config's, the default config is given without that section. A class the arguments do not name plainly (an
        environment variable, a short class name) is seen only in the parsed config: that one case parses again.
        """
        argv = list(sys.argv[1:] if args is None else args) if isinstance(args, (list, tuple, type(None))) else None
        if argv is None:
            super().parse_arguments(parser, args)
            return
        subcommand = next((a for a in argv if a in SUBCOMMANDS), None) if self.runs_a_subcommand else None
        chosen = chosen_classes(argv, subcommand)
        rebased = self._rebased_arguments(argv, subcommand, chosen)
        unresolved = any(name and import_class(name) is None for name in chosen.values())
        unresolved |= any(key.startswith("PL_") and key.endswith(("__MODEL", "__DATA")) for key in os.environ)
        # --print_config prints while parsing: where a class may still show only in the parsed config, it waits
        printing = [a for a in argv if str(a).startswith("--print_config")] if unresolved else []
        with warnings.catch_warnings():
            # the arguments are sys.argv's, passed on explicitly so that they can be rebased
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            super().parse_arguments(parser, [a for a in rebased or argv if a not in printing])
            if unresolved:
                parsed = self.config[subcommand] if subcommand is not None else self.config
                named = {key: (parsed.get(key) or Namespace()).get("class_path") for key in CLASSES}
                late = self._rebased_arguments(argv, subcommand, named)
                if late != rebased or printing:
                    super().parse_arguments(parser, late or argv)

    def _rebased_arguments(self, argv: list[str], subcommand: str | None, chosen: dict[str, Any]) -> list[str] | None:
        if not any(chosen.values()):
            return None  # the default config's classes: configs/default.yaml is the parser's to read
        rebased = rebased_arguments(argv, subcommand, chosen, load_config_file(str(DEFAULT_CONFIG)) or {})
        if rebased is not None:
            skip_default_config_files(self, subcommand)  # replaced by the same file without those sections
        return rebased

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
        place_loggers(self._chosen().trainer)

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
        if isinstance(self.trainer.strategy, PipelineStrategy):  # the split, on the model every process builds
            check_stages(self.model, self.trainer.strategy.stage_count)
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
        built, chosen = self._chosen(self.config_init), self._chosen()  # the objects the parser built; the options
        trainer = built.get("trainer") or {}
        strategy = strategy_name(trainer)
        flight_recorder_defaults(trainer, trainer.get("default_root_dir"))  # several CUDA processes only
        options = strategy_options(strategy, chosen.get("collective_timeout"), self.model)
        if strategy == PipelineStrategy.strategy_name:
            options.update(chosen.pipeline.as_dict())  # --pipeline.*
        if options:
            kwargs["strategy"] = strategy  # `auto` as `ddp`, where Lightning picks it
        callbacks, switches = template_callbacks(trainer, chosen, built, strategy)
        off = switches.pop("off")
        kwargs.update(switches)
        kwargs["plugins"] = checkpoint_plugins(trainer.get("plugins"), slurm_requeue="preemption" in off)
        with registered_with(strategy, options):
            return super().instantiate_trainer(callbacks=callbacks, **kwargs)


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
