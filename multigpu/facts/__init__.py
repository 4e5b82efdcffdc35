"""The facts of one run, derived once from its parsed options and launch; every later step reads them from here."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import Strategy

from multigpu.compat import registered_strategy
from multigpu.facts.argv import import_class
from multigpu.facts.environment import (
    MULTIPROCESS_PREFIXES,
    Launch,
    requested_devices,
    resolve_accelerator,
    this_launch,
    world_size,
)


@dataclass(frozen=True)
class RunFacts:
    """What a run is, as its options and launch say it (``RunFacts.of``)."""

    #: None where the command line runs no subcommand
    subcommand: str | None
    #: ``cuda`` (for ``gpu``, and ``auto`` on a machine with a GPU), ``cpu``, another name, or ``custom`` (an object)
    accelerator: str
    #: the devices of one node
    devices: int | None
    num_nodes: int
    #: ``--trainer.strategy`` as a lowercase name; None where it is a class or an object
    strategy: str | None
    #: ``auto`` named ``ddp`` where Lightning would pick ddp, so that it gets the engine's ddp options too
    trainer_strategy: Any
    #: the class ``--trainer.strategy`` names; None for ``auto`` and a name not registered
    strategy_class: type[Strategy] | None
    #: one process per device for the multi-process strategies (and ``auto``), else one (single device, dp)
    processes: int
    #: what started this process, its rank and what its ranks share (``this_launch``)
    launch: Launch
    run_dir: Path
    accumulate_grad_batches: int = 1
    sync_batchnorm: bool = False
    #: ``--trainer.max_time`` as given, which the engine's timer takes over
    max_time: Any = None
    #: Lightning's own progress bar, model summary and checkpointing, unless the trainer options switch them off
    lightning_progress_bar: bool = True
    lightning_model_summary: bool = True
    lightning_checkpointing: bool = True
    #: the engine's options (multigpu/run/parser.py)
    compile: bool = False
    callbacks_off: frozenset[str] = frozenset()
    progress_bar: str = "auto"
    batch_size_per_process: bool = False
    #: seconds; None for Lightning's own timeout
    collective_timeout: float | None = None
    #: the ``--pipeline.*`` options
    pipeline: Mapping[str, Any] = field(default_factory=dict)
    #: as written, for the messages that quote them
    accelerator_option: Any = "auto"
    devices_option: Any = "auto"
    model_class: str | None = None
    data_class: str | None = None
    #: ``--model.init_args``, against which a resumed checkpoint's hyperparameters are checked
    model_init_args: Mapping[str, Any] = field(default_factory=dict)
    #: ``--data.init_args.batch_size``, a global batch where the data class is a ``GlobalBatchDataModule``
    data_batch_size: Any = None
    #: ``--ckpt_path`` as given
    ckpt_path_option: Any = None
    #: the file ``--ckpt_path`` resolved to
    checkpoint: Path | None = None

    @classmethod
    def of(cls, options: Any, subcommand: str | None = None) -> RunFacts:
        """The facts of a subcommand's parsed options, or of a ``trainer`` mapping alone."""
        whole = "trainer" in options
        trainer = (options.get("trainer") if whole else options) or {}
        given = trainer.get("strategy", "auto")
        strategy = given.lower() if isinstance(given, str) else None
        accelerator = resolve_accelerator(trainer.get("accelerator", "auto"))
        devices = requested_devices(trainer.get("devices", "auto"), accelerator)
        num_nodes = int(trainer.get("num_nodes") or 1)
        # a notebook forks the processes of `auto` itself: there Lightning's own choice stands
        interactive = hasattr(sys, "ps1") or sys.flags.interactive
        several = (devices or 1) > 1 or num_nodes > 1
        return cls(
            subcommand=subcommand,
            accelerator=accelerator,
            devices=devices,
            num_nodes=num_nodes,
            strategy=strategy,
            trainer_strategy="ddp" if given == "auto" and several and not interactive else given,
            strategy_class=strategy_class_of(given),
            processes=world_size(strategy, devices or 1, num_nodes),
            launch=this_launch(),
            run_dir=Path(trainer.get("default_root_dir") or os.getcwd()),
            accumulate_grad_batches=int(trainer.get("accumulate_grad_batches") or 1),
            sync_batchnorm=bool(trainer.get("sync_batchnorm")),
            max_time=trainer.get("max_time"),
            lightning_progress_bar=trainer.get("enable_progress_bar") is not False,
            lightning_model_summary=trainer.get("enable_model_summary") is not False and not trainer.get("barebones"),
            lightning_checkpointing=trainer.get("enable_checkpointing") is not False,
            accelerator_option=trainer.get("accelerator", "auto"),
            devices_option=trainer.get("devices", "auto"),
            **(subcommand_options(options) if whole else {}),
        )

    def resuming(self, checkpoint: Path | None) -> RunFacts:
        return dataclasses.replace(self, checkpoint=checkpoint)

    @property
    def several_cuda_processes(self) -> bool:
        """Whether NCCL joins several processes: ``dp`` on several GPUs is one process."""
        return self.accelerator == "cuda" and self.processes > 1

    @property
    def one_process_strategy(self) -> bool:
        """Whether the strategy runs one process whatever the devices (single device, dp)."""
        named = self.strategy not in (None, "auto")
        return named and not str(self.strategy).startswith(MULTIPROCESS_PREFIXES)

    @property
    def strategy_option(self) -> str:
        given = self.trainer_strategy
        if isinstance(given, Strategy):
            return f"--trainer.strategy={type(given).__name__}()"
        named = class_path(given) if not isinstance(given, str) else None
        return f"--trainer.strategy.class_path={named}" if named else f"--trainer.strategy={given}"


def subcommand_options(options: Any) -> dict[str, Any]:
    """The facts of a subcommand's options beside ``--trainer``: the engine's, the model's, the data's, the
    checkpoint's."""
    data = options.get("data")
    return {
        "compile": bool(options.get("compile")),
        "callbacks_off": frozenset(options.get("callbacks_off") or ()),
        "progress_bar": options.get("progress_bar", "auto"),
        "batch_size_per_process": bool(options.get("batch_size_per_process")),
        "collective_timeout": options.get("collective_timeout"),
        "pipeline": plain(options.get("pipeline")),
        "model_class": class_path(options.get("model")),
        "model_init_args": plain(section_of(options.get("model")).get("init_args")),
        "data_class": class_path(data),
        "data_batch_size": section_of(section_of(data).get("init_args")).get("batch_size"),
        "ckpt_path_option": options.get("ckpt_path"),
    }


def section_of(value: Any) -> Any:
    """``value`` where it is a section of the options (a mapping or namespace), else an empty one."""
    return value if isinstance(value, Mapping) or hasattr(value, "get") else {}


def plain(section: Any) -> dict[str, Any]:
    """A section of the options as a plain mapping (a namespace's nested sections too)."""
    section = section_of(section)
    return section.as_dict() if hasattr(section, "as_dict") else dict(section)


def strategy_class_of(strategy: Any) -> type[Strategy] | None:
    """The class a ``--trainer.strategy`` value names: a registered name's, a ``class_path``'s or an object's."""
    if isinstance(strategy, str):
        registered = registered_strategy(strategy.lower())
        return registered[0] if registered else None
    if isinstance(strategy, Strategy):
        return type(strategy)
    named = class_path(strategy)
    return import_class(named) if named else None


def class_path(section: Any) -> str | None:
    """The class a ``model``, ``data`` or ``strategy`` section of the options names."""
    if isinstance(section, str):
        return section
    named = section_of(section).get("class_path")
    return named if isinstance(named, str) else None
