"""The engine's 1.x module names (multigpu/moved.py): each still imports, as the module that now holds its code, with
a warning naming the new one; a 1.x class path in a config still builds its class."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from multigpu.moved import MOVED
from multigpu.strategies.compile import CompileModel
from tests.cli import CLI
from tests.conftest import REPO, TINY


def forget(name: str) -> None:
    for loaded in [module for module in sys.modules if module == name or module.startswith(name + ".")]:
        del sys.modules[loaded]


@pytest.mark.parametrize("old", sorted(name for name in MOVED if not any(n.startswith(name + ".") for n in MOVED)))
def test_a_1x_module_name_imports_as_its_2x_module_with_a_warning_naming_it(old):
    forget(old)
    with pytest.warns(DeprecationWarning, match=f"{old} is {MOVED[old]} since multigpu 2.0.*Fix: import {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_the_table_names_only_modules_that_are_gone_and_modules_that_exist():
    for old, new in MOVED.items():
        old_path = REPO / old.replace(".", "/")
        assert not old_path.with_suffix(".py").exists() and not old_path.is_dir(), f"{old} still exists"
        assert importlib.util.find_spec(new) is not None, f"{new} does not exist"


def test_a_1x_class_path_on_the_command_line_builds_the_class():
    forget("multigpu.callbacks")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = CLI(args=[*TINY, "--trainer.callbacks+=multigpu.callbacks.compile.CompileModel"], run=False)
    assert any(isinstance(callback, CompileModel) for callback in cli.trainer.callbacks)
    assert any("multigpu.callbacks.compile is multigpu.strategies.compile" in str(w.message) for w in caught)
