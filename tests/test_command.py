"""The project's command line as users type it (``multigpu/command.py``): the module whose ``TemplateCLI`` runs,
else the one the project's ``pyproject.toml`` names, else ``src.cli``."""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

import pytest

from multigpu import TemplateCLI, command


@pytest.fixture(autouse=True)
def nothing_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "_running", None)


def cli_class_of(module: str) -> type:
    return type("CLI", (TemplateCLI,), {"__module__": module})


def test_the_module_a_projects_pyproject_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.multigpu]\ncli = "myproj.cli"\n')
    assert command.configured(tmp_path) == "myproj.cli"
    monkeypatch.chdir(tmp_path)
    assert command.prog() == "python -m myproj.cli"


@pytest.mark.parametrize("text", [None, '[project]\nname = "x"\n', "not [toml"])
def test_without_a_setting_the_templates_layout(tmp_path: Path, text: str | None) -> None:
    if text is not None:
        (tmp_path / "pyproject.toml").write_text(text)
    assert command.configured(tmp_path) == "src.cli"


def test_the_running_command_lines_module_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a folder whose project names none
    command.started_by(cli_class_of("myproj.cli"))
    assert command.prog() == "python -m myproj.cli"
    command.started_by(TemplateCLI)  # the engine's own class names no project: the project's stays
    assert command.module() == "myproj.cli"


@pytest.mark.parametrize("name", ["__main__", "__mp_main__"])
def test_run_as_a_module_its_import_spec_names_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m lab.cli`` runs it as ``__main__`` (a ``ddp_spawn`` worker as ``__mp_main__``)."""
    main = ModuleType(name)
    main.__spec__ = ModuleSpec("lab.cli", None)
    monkeypatch.setitem(sys.modules, name, main)
    command.started_by(cli_class_of(name))
    assert command.module() == "lab.cli"


def test_the_help_and_the_errors_name_the_running_module(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_class_of("lab.cli")(args=["fit", "--trainer.max_epoch=1"])
    assert exit_.value.code == 2
    assert "`python -m lab.cli fit --help`" in capsys.readouterr().err
