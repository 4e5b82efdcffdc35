"""``TemplateCLI``, the ``LightningCLI`` that owns a project's run: its ``parse_arguments``, ``instantiate_classes``,
then the subcommand (docs/engine.md, "Reading a run")."""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# the imports' ~360,000 lifelong objects, frozen: `fit --help` 2.8 CPU-s, not 4.4 (docs/benchmarks.md, "Start-up")
_COLLECTING = gc.isenabled()
gc.disable()

import lightning as L
from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from torch.multiprocessing import ProcessExitedException

from multigpu import compat
from multigpu.checkpoints.resume import resolve_checkpoint
from multigpu.command import prog, started_by
from multigpu.errors import TrainingStopped
from multigpu.errors.quiet import silence_known_noise
from multigpu.errors.reporting import report, report_desk
from multigpu.facts import RunFacts
from multigpu.facts.argv import CLASSES, chosen_classes, named_subcommand, rebased_defaults, unresolved
from multigpu.faults.preemption import STOP_EXIT_CODES, forward_stop_signals_to_workers
from multigpu.observe import first_step
from multigpu.run.checks import check_before_launch, check_built, check_resumed
from multigpu.run.parser import TemplateArgumentParser, add_config_option, add_template_options
from multigpu.run.run_dir import place_loggers, shared_random_seed
from multigpu.run.run_lock import hold_run_dir, release_run_dir
from multigpu.run.trainer import (
    building_error,
    flight_recorder_defaults,
    run_callbacks,
    strategy_as_class,
    strategy_class,
    trainer_settings,
)
from multigpu.strategies import register_strategies

gc.freeze()
if _COLLECTING:
    gc.enable()


def _thaw_for_nanobind() -> None:
    """Unfreeze at exit where a nanobind extension is loaded: nanobind prints every live object as leaked."""
    for module in list(sys.modules.values()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if origin.endswith((".so", ".pyd")) and any(
            type(getattr(module, name, None)).__name__ == "nb_func" for name in dir(module)
        ):
            gc.unfreeze()
            return


atexit.register(_thaw_for_nanobind)

__all__ = ["TemplateCLI", "run_cli", "shared_random_seed"]


class TemplateCLI(LightningCLI):
    """LightningCLI with the engine's options and the project's default config, owning the run and what it builds."""

    #: the project's ``configs/default.yaml``, read first by every subcommand
    default_config: Path | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "instantiate_classes" in vars(cls):
            raise TypeError(
                f"{cls.__qualname__}.instantiate_classes is never called: TemplateCLI.instantiate_classes builds the"
                " model, data module, callbacks and Trainer in the run's order (since release 1.2). Fix: move that"
                " code to before_instantiate_classes (before the objects are built), after_instantiate_classes (once"
                " the Trainer is built) or instantiate_trainer (calling super().instantiate_trainer(**kwargs));"
                " docs/engine.md, 'Extending the command line'."
            )

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        first_step.command_started()  # the time to the first step, in parts (multigpu/observe/first_step.py)
        started_by(type(self))  # the project's module: what --help, the errors and the subprocesses name
        listed = isinstance(args, (list, tuple, type(None)))
        self.argv = list(sys.argv[1:] if args is None else args) if listed else None
        self.named = named_subcommand(self.argv) if run and listed else None
        #: only the named subcommand's parser is built, where the arguments start with it
        self.alone = bool(self.argv) and self.argv[0] == self.named
        self.rebasing = self.argv is not None and (self.named is not None or not run)
        self.classes = chosen_classes(self.argv, self.named) if self.rebasing else {}
        #: configs/default.yaml with the classes the arguments change replaced, each starting from its own defaults
        self.rebased = rebased_defaults(self.classes, self.default_config) if self.rebasing else None
        self.option_parsers: dict[str | None, LightningArgumentParser] = {}
        self.facts: RunFacts | None = None
        #: the checkpoint and its contents, read once for the checks before Lightning loads it
        self.resumed: tuple[Path, dict[str, Any] | None] | None = None
        silence_known_noise()
        register_strategies()
        #: a trainer_class given here runs every subcommand; else `tune` alone runs on the engine's tuning Trainer
        self.own_trainer_class = "trainer_class" in kwargs
        if not self.own_trainer_class:
            builds_tune = run and (self.named == "tune" or not self.alone)
            kwargs["trainer_class"] = tuning_trainer() if builds_tune else L.Trainer
        files = [str(self.default_config)] if self.default_config is not None and not self.rebased else []
        defaults = {"default_config_files": files, "default_env": True}
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        try:
            super().__init__(
                model_class=L.LightningModule,
                datamodule_class=L.LightningDataModule,
                subclass_mode_model=True,
                subclass_mode_data=True,
                parser_kwargs={"prog": prog(), **(defaults if not run else {"default_env": True})}
                | {name: {**defaults, "options_of": name} for name in self.subcommands()},
                parser_class=TemplateArgumentParser,
                auto_configure_optimizers=False,
                args=args,
                run=run,
                **kwargs,
            )
        finally:
            if run:
                release_run_dir()

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Lightning's subcommands and ``tune``; only the one named, so that a run builds one parser."""
        every = {**LightningCLI.subcommands(), "tune": {"model", "datamodule"}}
        return {self.named: every[self.named]} if self.alone else every

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        subcommand = kwargs.pop("options_of", None)
        kwargs.setdefault("dump_header", [f"lightning.pytorch=={L.__version__}"])
        parser = self.parser_class(**kwargs)
        parser.default_config = self.default_config
        add_config_option(parser)
        self.option_parsers[subcommand] = parser
        return parser

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """The engine's options here: ``add_arguments_to_parser`` is the project's to override, maybe without super."""
        super().add_core_arguments_to_parser(parser)
        add_template_options(parser)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse, derive the facts and take the run, before LightningCLI reads the ``--ckpt_path`` file and seeds."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            self._parse_once(parser, args)
        if self.config.get("subcommand") != "tune" and not self.own_trainer_class:
            self.trainer_class = L.Trainer
        strategy_as_class(self.chosen().trainer)
        self.facts = RunFacts.of(self.chosen(), self.config.get("subcommand"))
        if self.facts.subcommand is not None:
            self.take_run()

    def take_run(self) -> None:
        """The checks (nothing taken or written yet); the run directory, held before the checkpoint is read, so that
        a live run's folder is neither read nor repaired; the checkpoint, read once and checked; a shared seed."""
        options, facts = self.chosen(), self.facts
        check_before_launch(facts, self.argv)
        hold_run_dir(facts.run_dir, facts.subcommand, facts.launch)
        self.resumed = resolve_checkpoint(facts, options)
        check_resumed(self.resumed, facts, self.argv)
        self.facts = facts.resuming(self.resumed[0] if self.resumed else None)
        if options.get("seed_everything") is True:
            options["seed_everything"] = shared_random_seed()  # the same on every process of one launch

    def instantiate_classes(self) -> None:
        """The objects the options name, then the Trainer, then the checks of what was built."""
        facts, options = self.facts, self.chosen()
        first_step.mark("engine")
        place_loggers(options.trainer, facts.run_dir)
        try:
            self.config_init = self.parser.instantiate_classes(self.config)
        except Exception as error:
            raise building_error(error, facts, objects_built=False) from error
        built = self.chosen(self.config_init)
        self.model, self.datamodule = built.get("model"), built.get("data")
        first_step.mark("model and data")
        self.trainer = self.build_trainer(built)
        first_step.mark("Trainer")
        if facts.subcommand is None:
            return
        check_built(facts, self.model, self.datamodule, self.trainer, self.resumed)
        self.resumed = None  # checked: the memory-mapped file is Lightning's to read now

    def build_trainer(self, built: Namespace) -> L.Trainer:
        """The Trainer with the run's callbacks, strategy options and plugins, through ``instantiate_trainer``."""
        callbacks, switches, off = run_callbacks(self.facts, built)
        arguments, strategy_settings, plugins = trainer_settings(self.facts, built, self.model, off)
        flight_recorder_defaults(self.facts)  # before the process group exists
        strategy = arguments.get("strategy")
        try:
            # a strategy given by name is built from Lightning's registry, which keeps its precision handling
            with compat.registered_with(strategy, strategy_settings, strategy_class(strategy)):
                return self.instantiate_trainer(**arguments, **switches, callbacks=callbacks, plugins=plugins)
        except Exception as error:
            raise building_error(error, self.facts, objects_built=True) from error

    def _parse_once(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse from ``self.rebased``; again, rebased, where a class shows only in the parsed config."""
        if self.rebased is not None:
            self._start_from(self.rebased)
        late = self.rebasing and unresolved(self.classes)
        # --print_config prints while parsing: where a class may still show only in the parsed config, it waits
        printing = [a for a in self.argv if str(a).startswith("--print_config")] if late else []
        super().parse_arguments(parser, [a for a in self.argv if a not in printing] if printing else args)
        if not late:
            return
        named = {key: (self.chosen().get(key) or Namespace()).get("class_path") for key in CLASSES}
        rebased = rebased_defaults(named, self.default_config)
        if rebased != self.rebased or printing:
            if rebased is not None:
                self.option_parsers[self.named].default_config_files = []
                self._start_from(rebased)
            super().parse_arguments(parser, args)

    def _start_from(self, defaults: dict[str, Any]) -> None:
        """The rebased default config as the subcommand parser's; what it refuses is that file's error."""
        try:
            self.option_parsers[self.named].set_defaults(defaults)
        except Exception as error:
            self.parser.error(f"{self.default_config}: {error.args[0] if error.args else error}")

    def fit(self, **kwargs: Any) -> None:
        """The ``fit`` subcommand, ``trainer.fit`` (a subclass that overrides it calls ``super().fit(**kwargs)``)."""
        with self.speaking_for_ranks():
            self.trainer.fit(**kwargs)

    def validate(self, **kwargs: Any) -> None:
        with self.speaking_for_ranks():
            self.trainer.validate(**kwargs)

    def test(self, **kwargs: Any) -> None:
        with self.speaking_for_ranks():
            self.trainer.test(**kwargs)

    def predict(self, **kwargs: Any) -> None:
        with self.speaking_for_ranks():
            self.trainer.predict(**kwargs)

    def tune(self, **kwargs: Any) -> None:
        with self.speaking_for_ranks():
            self.trainer.tune(**kwargs)

    @contextlib.contextmanager
    def speaking_for_ranks(self) -> Iterator[None]:
        """Stop signals forwarded to ddp_spawn's workers; under ddp this process speaks for the ranks it starts."""
        fitting = self.facts.strategy if self.facts.subcommand == "fit" else None
        speaks = compat.starts_other_ranks(self.trainer)
        desk = report_desk(self.trainer, before_exit=release_run_dir) if speaks else contextlib.nullcontext()
        with forward_stop_signals_to_workers(fitting), desk:
            yield

    def chosen(self, config: Namespace | None = None) -> Namespace:
        """The options of this run's subcommand (all, without subcommands)."""
        config = self.config if config is None else config
        return config[config.subcommand] if config.get("subcommand") else config


def tuning_trainer() -> type[L.Trainer]:
    """The engine's tuning Trainer, imported only where the ``tune`` subcommand's parser is built."""
    from multigpu.tuning import Trainer

    return Trainer


def run_cli(args: list[str] | None = None, cli_class: type[TemplateCLI] = TemplateCLI) -> None:
    """Run ``cli_class`` on ``args``; exit 2 on a configuration error, ``TrainingStopped.exit_code`` after a stop."""
    # NCCL: a failed or timed-out collective aborts the process instead of leaving the other ranks waiting
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    try:
        cli_class(args=args)
    except TrainingStopped as stop:
        rank = rank_zero_only.rank
        print(f"{stop.label}: {f'(rank {rank}) ' if rank else ''}{stop}", file=sys.stderr)
        sys.exit(stop.exit_code)
    except ProcessExitedException as worker:
        if worker.exit_code not in STOP_EXIT_CODES:
            sys.exit(report(worker))  # one line, not torch.multiprocessing's traceback
        sys.exit(worker.exit_code)  # ddp_spawn workers stopped on a signal; rank 0 printed why
    except Exception as error:
        sys.exit(report(error))


if multiprocessing.parent_process() is not None:
    # a ddp_spawn worker: multiprocessing imports the project's src/cli.py as __mp_main__, never calling main()
    silence_known_noise()
