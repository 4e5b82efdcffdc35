"""The facts of one run, derived once from its parsed options before anything is built: the subcommand, the
devices and processes, the strategy, the run directory, the model and data classes and the checkpoint resumed from.
The command line derives them (``multigpu/run.py``) and every step after it reads them from here."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multigpu.environment import requested_devices, resolve_accelerator, world_size


@dataclass(frozen=True)
class RunFacts:
    """What a run is, as its options say it (``RunFacts.of``); nothing here is checked yet (``multigpu/checks.py``
    refuses what cannot run)."""

    #: ``fit``, ``validate``, ``test``, ``predict``, ``tune``; None where the command line runs no subcommand
    subcommand: str | None
    #: ``cuda`` (for ``gpu`` and ``auto`` on a machine with a GPU), ``cpu``, another name, or ``custom`` (an object)
    accelerator: str
    #: the devices of one node ``--trainer.devices`` asks for; None where that cannot be told before the Trainer
    devices: int | None
    num_nodes: int
    #: ``--trainer.strategy`` as a lowercase name; None where it is a class or an object
    strategy: str | None
    #: ``--trainer.strategy`` as the Trainer gets it: ``auto`` named ``ddp`` where Lightning would pick ddp (several
    #: processes), so that such a run gets the engine's collective timeout and DDP options too
    trainer_strategy: Any
    #: the processes of the run: one per device for the multi-process strategies, else one (single device, dp)
    processes: int
    #: ``--trainer.default_root_dir`` (the working directory where unset): checkpoints, logs, the run's lock
    run_dir: Path
    model_class: str | None = None
    data_class: str | None = None
    #: the checkpoint file ``--ckpt_path`` resolved to, once read (``multigpu/checkpoints/resume.py``)
    checkpoint: Path | None = None

    @classmethod
    def of(cls, options: Any, subcommand: str | None = None) -> RunFacts:
        """The facts of a subcommand's parsed options (or of a ``trainer`` mapping alone, for its launch facts)."""
        whole = "trainer" in options  # a subcommand's options, else a trainer mapping alone
        trainer = (options.get("trainer") if whole else options) or {}
        given = trainer.get("strategy", "auto")
        strategy = given.lower() if isinstance(given, str) else None
        accelerator = resolve_accelerator(trainer.get("accelerator", "auto"))
        devices = requested_devices(trainer.get("devices", "auto"), accelerator)
        num_nodes = int(trainer.get("num_nodes") or 1)
        processes = world_size(strategy, devices or 1, num_nodes)
        # a notebook forks the processes of `auto` itself: there Lightning's own choice stands
        interactive = hasattr(sys, "ps1") or sys.flags.interactive
        several = (devices or 1) > 1 or num_nodes > 1
        trainer_strategy = "ddp" if given == "auto" and several and not interactive else given
        return cls(
            subcommand=subcommand,
            accelerator=accelerator,
            devices=devices,
            num_nodes=num_nodes,
            strategy=strategy,
            trainer_strategy=trainer_strategy,
            processes=processes,
            run_dir=Path(trainer.get("default_root_dir") or os.getcwd()),
            model_class=class_path(options.get("model")) if whole else None,
            data_class=class_path(options.get("data")) if whole else None,
        )

    def resuming(self, checkpoint: Path | None) -> RunFacts:
        """These facts with the checkpoint the run resumes (or evaluates) from."""
        return dataclasses.replace(self, checkpoint=checkpoint)

    @property
    def several_cuda_processes(self) -> bool:
        """Whether the run has several CUDA processes (on this node or across nodes): NCCL's territory. ``dp`` on
        several GPUs is one process."""
        return self.accelerator == "cuda" and self.processes > 1


def class_path(section: Any) -> str | None:
    """The class a ``model`` or ``data`` section of the options names."""
    if isinstance(section, Mapping) or hasattr(section, "get"):
        named = section.get("class_path")
        return named if isinstance(named, str) else None
    return section if isinstance(section, str) else None
