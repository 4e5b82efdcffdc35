"""The command line a project runs as ``python -m src.cli {fit,validate,test,predict,tune} [--config FILE ...]
[--key=value ...]``: the project's ``src/cli.py`` subclasses ``TemplateCLI`` with its ``configs/default.yaml`` and
calls ``run_cli``.

``TemplateCLI`` reads the command line: every option comes from LightningCLI (docs/command_line.md), with the
engine's own (``parser.py``), and the project's default config is read first. The parser of the subcommand named
is built alone and parses the arguments once; a model or data class they name starts from its own defaults, not
from those of the default config's class (jsonargparse would carry over every default of that class the new one
also takes, e.g. a ``batch_size``): the parser gets the default config with that section replaced by the class
alone (``argv.py``). Everything after the parse, from the checks to the subcommand, is ``run.py``, in order.
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing
import os
import sys
import warnings
from pathlib import Path
from typing import Any

# Importing torch, Lightning and torchmetrics creates about 360,000 objects that live as long as the process, and
# the garbage collector ran 914 times over the growing heap while `fit --help` imported them. Every process of a
# run (each rank, each spawned process) imports this module first, so collection waits until the imports below are
# done, and what they created is then frozen out of later collections: `fit --help` takes 2.8 CPU-s instead of 4.4
# on 2 cores (docs/benchmarks.md, "Start-up").
_COLLECTING = gc.isenabled()
gc.disable()

import lightning as L
from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from torch.multiprocessing import ProcessExitedException

from multigpu.argv import CLASSES, chosen_classes, named_subcommand, rebased_defaults, unresolved
from multigpu.callbacks.preemption import STOP_EXIT_CODES
from multigpu.command import prog, started_by
from multigpu.compat import parse_only, skip_default_config_files, subcommand_parser
from multigpu.errors import TrainingStopped
from multigpu.facts import RunFacts
from multigpu.parser import TemplateArgumentParser, add_config_option, add_template_options
from multigpu.quiet import silence_known_noise
from multigpu.reporting import report
from multigpu.run import run_command
from multigpu.run_dir import shared_random_seed
from multigpu.run_lock import release_run_dir
from multigpu.strategies import register_strategies
from multigpu.trainer_arguments import strategy_as_class

gc.freeze()  # what the imports created stays: no later collection walks it again
if _COLLECTING:
    gc.enable()


def _thaw_for_nanobind() -> None:
    """At exit, where a nanobind extension is loaded: return the frozen objects to the collector.

    The interpreter's last collections skip frozen objects, so the imports' reference cycles (every class is one)
    outlive the interpreter. That is free, and saves the ~1 CPU-s those collections take over the imports' heap,
    except to nanobind, which counts its classes and objects still alive at exit and prints each as leaked (about
    30 lines after every command where torch's CUDA build imports triton). atexit runs before those collections.
    """
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
    """LightningCLI's command line with the engine's options and the project's default config; after the parse, the
    run is ``multigpu/run.py``'s (see the module docstring)."""

    #: the project's ``configs/default.yaml``, read first by every subcommand (None: none); a project's subclass
    #: names its own (``src/cli.py``)
    default_config: Path | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "instantiate_classes" in vars(cls):  # it would be skipped without a word: the run builds the objects
            raise TypeError(
                f"{cls.__qualname__}.instantiate_classes is never called: multigpu/run.py builds the model, data"
                " module and Trainer itself (since release 1.2). Fix: move that code to before_instantiate_classes"
                " (before the objects are built), after_instantiate_classes (once the Trainer is built) or"
                " instantiate_trainer (calling super().instantiate_trainer(**kwargs)); docs/engine.md, 'Extending"
                " the command line'."
            )

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        started_by(type(self))  # the project's module: what --help, the errors and the subprocesses name
        listed = isinstance(args, (list, tuple, type(None)))  # else a dict or Namespace, parsed as an object
        #: the command's arguments (None: given as an object)
        self.argv = list(sys.argv[1:] if args is None else args) if listed else None
        #: the subcommand the arguments name (run=False: none, one parser with the options at the top)
        self.named = named_subcommand(self.argv) if run and listed else None
        #: whether its parser alone is built: where the arguments start with it (an option of the main parser may
        #: come first, --help listing every subcommand or a --config with sections of several: every one is built)
        self.alone = bool(self.argv) and self.argv[0] == self.named
        #: whether the arguments are read for the classes they name
        self.rebasing = self.argv is not None and (self.named is not None or not run)
        self.classes = chosen_classes(self.argv, self.named) if self.rebasing else {}
        #: configs/default.yaml with the sections of the classes the arguments change replaced by those classes
        self.rebased = rebased_defaults(self.classes, self.default_config) if self.rebasing else None
        #: the run's facts, derived once after the parse (``multigpu/run.py``)
        self.facts: RunFacts | None = None
        #: whether the model and data module keep the parsed options, so that ``load_from_checkpoint`` rebuilds them
        self.load_from_checkpoint_support = kwargs.pop("load_from_checkpoint_support", True)
        silence_known_noise()  # multigpu/quiet.py: the lines every run printed that say nothing about the run
        register_strategies()  # multigpu/strategies/__init__.py: dp, fsdp2, tensor_parallel, pipeline
        #: a trainer_class given here runs every subcommand; else `tune` alone runs on the engine's tuning Trainer
        self.own_trainer_class = "trainer_class" in kwargs
        if not self.own_trainer_class:
            builds_tune = run and (self.named == "tune" or not self.alone)
            kwargs["trainer_class"] = tuning_trainer() if builds_tune else L.Trainer
        # where the arguments change a class, the template gives the parser configs/default.yaml, rebased
        files = [str(self.default_config)] if self.default_config is not None and not self.rebased else []
        defaults = {"default_config_files": files, "default_env": True}
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        try:
            # LightningCLI builds the parser and parses (``parse_arguments`` below); the rest is ``run_command``'s
            parse_only(
                self,
                run,
                model_class=L.LightningModule,
                datamodule_class=L.LightningDataModule,
                subclass_mode_model=True,
                subclass_mode_data=True,
                # run=False (in a script or notebook) builds one parser without subcommands: it reads the defaults
                parser_kwargs={"prog": prog(), **(defaults if not run else {"default_env": True})}
                | {name: dict(defaults) for name in self.subcommands()},
                parser_class=TemplateArgumentParser,
                auto_configure_optimizers=False,  # models take their optimizer as an argument (TemplateModule)
                args=args,
                **kwargs,
            )
            run_command(self)
        finally:
            if run:  # the run directory the checks took is free again, however the command ended
                release_run_dir()

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Lightning's subcommands and ``tune`` (its options from the engine's tuning ``Trainer.tune``, as fit's from
        ``Trainer.fit``), each with the arguments it takes from the built objects; only the one named, so that a
        run builds one parser (LightningCLI builds one for every subcommand this returns)."""
        every = {**LightningCLI.subcommands(), "tune": {"model", "datamodule"}}
        return {self.named: every[self.named]} if self.alone else every

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """LightningCLI's parser, with a ``--config`` help that says how it combines with other arguments."""
        kwargs.setdefault("dump_header", [f"lightning.pytorch=={L.__version__}"])
        parser = self.parser_class(**kwargs)
        parser.default_config = self.default_config  # its errors name the file a key came from
        add_config_option(parser)
        return parser

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Lightning's ``--trainer``, ``--model`` and ``--data``, then the engine's options (``parser.py``): here,
        not in ``add_arguments_to_parser``, which is the project's to override (docs/engine.md, "Extending the
        command line"), with or without ``super()``."""
        super().add_core_arguments_to_parser(parser)
        add_template_options(parser)

    # -- parse, then check before anything is built -----------------------------------------------------------

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse once (``_parse_once``); a strategy given as an import path becomes that class."""
        with warnings.catch_warnings():
            # the arguments are sys.argv's, passed on explicitly where --print_config waits for the last parse
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            self._parse_once(parser, args)
        if self.config.get("subcommand") != "tune" and not self.own_trainer_class:
            self.trainer_class = L.Trainer  # every subcommand's parser was built: fit, ... run on Lightning's own
        strategy_as_class(self.chosen().trainer)

    def _parse_once(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse once, from ``self.rebased`` where the arguments name a class plainly. A class they do not name
        plainly (an environment variable, a short class name) is seen only in the parsed config: where it changes
        the default config's class, that one case parses again, from the default config rebased."""
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
                skip_default_config_files(self, self.named)  # replaced by the same file, rebased
                self._start_from(rebased)
            super().parse_arguments(parser, args)

    def _start_from(self, defaults: dict[str, Any]) -> None:
        """The subcommand's parser takes ``defaults`` (configs/default.yaml, rebased) as its defaults; what it
        refuses is an error in that file, said in one paragraph as jsonargparse says it of a default config file."""
        try:
            subcommand_parser(self, self.named).set_defaults(defaults)
        except Exception as error:
            self.parser.error(f"{self.default_config}: {error.args[0] if error.args else error}")

    def fit(self, **kwargs: Any) -> None:
        """The ``fit`` subcommand, ``trainer.fit`` (a subclass that overrides it calls ``super().fit(**kwargs)``)."""
        self.trainer.fit(**kwargs)

    def chosen(self, config: Namespace | None = None) -> Namespace:
        """The options of this run's subcommand (all options, where the CLI runs without subcommands)."""
        config = self.config if config is None else config
        return config[config.subcommand] if config.get("subcommand") else config


def tuning_trainer() -> type[L.Trainer]:
    """The engine's tuning Trainer, whose ``tune`` method gives the ``tune`` subcommand its options: imported only
    where that subcommand's parser is built (a ``tune`` run, or every subcommand's for the main parser's help)."""
    from multigpu.tuning import Trainer

    return Trainer


def run_cli(args: list[str] | None = None, cli_class: type[TemplateCLI] = TemplateCLI) -> None:
    """A project's command line: ``cli_class`` (the project's ``TemplateCLI`` with its default config) run on ``args``
    (default: ``sys.argv[1:]``); exits with status 2 on a configuration error and with ``TrainingStopped.exit_code``
    after a stop (75, 130 or 143 after a signal, 65 on a non-finite loss)."""
    # NCCL: a failed or timed-out collective aborts the process instead of leaving the other ranks waiting
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    try:
        cli_class(args=args)
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


if multiprocessing.parent_process() is not None:
    # a ddp_spawn worker: multiprocessing runs the project's src/cli.py under the name __mp_main__ (which imports
    # this module) instead of calling main()
    silence_known_noise()
