"""The engine's modules as 1.x named them, still importable through 2.x with a ``DeprecationWarning``: a class path
in a 1.x ``config.yaml`` (``multigpu.callbacks.compile.CompileModel``) or an import of a project keeps working.
CHANGELOG.md (2.0.0) lists the same moves for a reader."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any

#: 1.x module -> 2.0 module
MOVED = {
    "multigpu.argv": "multigpu.facts.argv",
    "multigpu.callbacks": "multigpu.run.trainer",
    "multigpu.callbacks.checkpoint": "multigpu.checkpoints.schedule",
    "multigpu.callbacks.compile": "multigpu.strategies.compile",
    "multigpu.callbacks.continuation": "multigpu.checkpoints.continuation",
    "multigpu.callbacks.hang_report": "multigpu.faults.hang_report",
    "multigpu.callbacks.loaders": "multigpu.data.engine_loaders",
    "multigpu.callbacks.nan_guard": "multigpu.faults.nan_guard",
    "multigpu.callbacks.precision": "multigpu.strategies.precision",
    "multigpu.callbacks.preemption": "multigpu.faults.preemption",
    "multigpu.callbacks.progress": "multigpu.observe.progress",
    "multigpu.callbacks.random_state": "multigpu.checkpoints.random_state",
    "multigpu.callbacks.ranks": "multigpu.faults.ranks",
    "multigpu.callbacks.run_plan": "multigpu.observe.run_plan",
    "multigpu.callbacks.stack_dumps": "multigpu.faults.stack_dumps",
    "multigpu.callbacks.steps": "multigpu.steps",
    "multigpu.callbacks.straggler": "multigpu.observe.straggler",
    "multigpu.callbacks.summary": "multigpu.observe.summary",
    "multigpu.callbacks.throughput": "multigpu.observe.throughput",
    "multigpu.checks": "multigpu.run.checks",
    "multigpu.cli": "multigpu.run.cli",
    "multigpu.environment": "multigpu.facts.environment",
    "multigpu.failures": "multigpu.errors.failures",
    "multigpu.hook_readers": "multigpu.hooks.readers",
    "multigpu.parser": "multigpu.run.parser",
    "multigpu.processes": "multigpu.faults.processes",
    "multigpu.quiet": "multigpu.errors.quiet",
    "multigpu.reporting": "multigpu.errors.reporting",
    "multigpu.run_dir": "multigpu.run.run_dir",
    "multigpu.run_lock": "multigpu.run.run_lock",
    "multigpu.topology": "multigpu.data.topology",
    "multigpu.trainer_arguments": "multigpu.run.trainer",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a 1.x name as the module that now holds its code (a 1.x package whose modules all moved, as a
    package that finds them)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=self._was_package(name))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name]
        module = importlib.import_module(new)
        if self._was_package(spec.name):  # the 1.x modules under it are found in it, and warn themselves
            package = types.ModuleType(spec.name)
            package.__path__ = []
            package.__getattr__ = lambda attribute: getattr(module, attribute)
            return package
        warnings.warn(
            f"{spec.name} is {new} since multigpu 2.0; the old name works through 2.x. Fix: import {new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass

    @staticmethod
    def _was_package(name: str) -> bool:
        return any(other.startswith(name + ".") for other in MOVED)


def install() -> None:
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
