"""The command line read as written, where the parsed config cannot say it (which ``--config`` set an option, the
classes and subcommand named). Every reading of the raw arguments is here."""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

#: the config sections whose class a command line may change
CLASSES = ("model", "data")
SUBCOMMANDS = ("fit", "validate", "test", "predict", "tune")


def named_subcommand(args: Sequence[Any]) -> str | None:
    """The subcommand the arguments name, if any."""
    return next((str(a) for a in args if a in SUBCOMMANDS), None)


def option_origin(args: Sequence[Any] | None, key: str) -> tuple[str | None, list[str]]:
    """``(file, earlier flags it overrides)`` where a ``--config`` file sets ``trainer.<key>`` last."""
    if not isinstance(args, (list, tuple)):
        return None, []
    origin: str | None = None
    flags: list[str] = []
    overridden: list[str] = []
    args = [str(a) for a in args]
    flag = f"--trainer.{key}"
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") or arg.startswith("--config="):
            path = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            if key in trainer_section(path):
                origin, overridden = path, list(flags)
        elif arg == flag or arg.startswith(flag + "="):
            value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            origin, overridden = None, []
            flags.append(f"{flag}={value}")
    return (origin, overridden) if origin is not None else (None, [])


def trainer_section(path: str) -> dict[str, Any]:
    """The ``trainer`` mapping of a YAML config file, or ``{}`` (not a file, not YAML, no such section)."""
    try:
        loaded = yaml.safe_load(Path(path).read_text()) if path and Path(path).is_file() else None
    except (OSError, yaml.YAMLError):
        return {}
    section = loaded.get("trainer") if isinstance(loaded, dict) else None
    return section if isinstance(section, dict) else {}


def given_as(args: Sequence[Any] | None, key: str, value: Any, also: str = "") -> str:
    """``--trainer.<key>=<value>``, then ``(set by FILE ...)`` when a ``--config`` file set it."""
    origin, overridden = option_origin(args, key)
    shown = f"--trainer.{key}={yaml_value(value)}"
    if origin is None:
        return shown
    notes = [f"set by {origin}"] + ([also] if also else [])
    if overridden:
        notes.append(
            f"which overrides the earlier {' '.join(overridden)}: arguments apply in order and a later one wins,"
            " so put --config files first"
        )
    return f"{shown} ({', '.join(notes)})"


def yaml_value(value: Any) -> str:
    """A value as it is written on the command line: ``4``, ``gpu``, ``[0, 1]``."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def import_class(class_path: str) -> type | None:
    """The class a config's ``class_path`` names, or None where it cannot be imported (jsonargparse says why)."""
    module_name, _, name = str(class_path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None


def config_files(args: Sequence[Any]) -> list[str]:
    """The values of ``--config`` among the arguments, in order (files, or YAML strings given in their place)."""
    args = [str(a) for a in args]
    return [
        args[i + 1] if a == "--config" else a.split("=", 1)[1]
        for i, a in enumerate(args)
        if (a == "--config" and i + 1 < len(args)) or a.startswith("--config=")
    ]


def load_config_file(name: str) -> Any:
    """A ``--config`` file's contents (raises ``yaml.YAMLError``), read once per process and change."""
    path = Path(name)
    return _load_yaml(str(path.resolve()), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _load_yaml(path: str, mtime_ns: int) -> Any:
    return yaml.safe_load(Path(path).read_text())


def yaml_problem(args: Any) -> str | None:
    """The first ``--config`` file among the arguments that is not valid YAML, as a one-paragraph error."""
    if not isinstance(args, (list, tuple)):
        return None
    for name in config_files(args):
        if not Path(name).is_file():
            continue  # jsonargparse reports a missing file
        try:
            load_config_file(name)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            return (
                f"--config {name} is not valid YAML{where}: {problem}. Fix: correct that line (a list is [a, b],"
                " a mapping is 'key: value' with consistent indentation); nothing was run."
            )
    return None


def chosen_classes(argv: list[str], subcommand: str | None) -> dict[str, str | None]:
    """The ``class_path`` of the model and data module the arguments name, read as jsonargparse reads them."""
    chosen: dict[str, str | None] = dict.fromkeys(CLASSES)
    options = argv[argv.index(subcommand) + 1 :] if subcommand is not None else argv
    for index, argument in enumerate(options):
        name, equals, value = str(argument).partition("=")
        if not equals:
            value = str(options[index + 1]) if index + 1 < len(options) else ""
        if name == "--config":
            try:
                sections = load_config_file(value) if Path(value).is_file() else yaml.safe_load(value)
            except yaml.YAMLError:
                continue
            for key in CLASSES if isinstance(sections, dict) else ():
                section = sections.get(key)
                class_path = section.get("class_path") if isinstance(section, dict) else section
                if isinstance(class_path, str):
                    chosen[key] = class_path
        for key in CLASSES:
            if name in (f"--{key}", f"--{key}.class_path") and value and not value.startswith("-"):
                chosen[key] = value
    return chosen


def unresolved(chosen: dict[str, str | None]) -> bool:
    """Whether the classes may show only in the parsed config: a short name, or an environment variable."""
    environment = any(key.startswith("PL_") and key.endswith(("__MODEL", "__DATA")) for key in os.environ)
    return environment or any(name and import_class(name) is None for name in chosen.values())


def changes_class(chosen: str, default: Any) -> bool:
    """Whether ``chosen`` names another class than ``default``; the default's class (an example the user replaced) is
    imported only where it may be the chosen class under another path."""
    if chosen == default:
        return False
    named = import_class(chosen)
    if named is None:
        return False  # the parser resolves it (a short name) or says why not
    if not isinstance(default, str) or named.__name__ != default.rpartition(".")[2]:
        return True
    return named is not import_class(default)


def rebased_defaults(chosen: dict[str, Any], default_config: Path | None) -> dict[str, Any] | None:
    """``default_config`` with each section whose class ``chosen`` changes replaced by that class alone, which then
    starts from its own defaults, not the init_args jsonargparse keeps; None where ``chosen`` changes none."""
    if default_config is None or not any(chosen.values()):
        return None
    defaults = load_config_file(str(default_config)) or {}
    changed = {
        key: {"class_path": class_path}
        for key, class_path in chosen.items()
        if class_path and changes_class(str(class_path), section_class(defaults.get(key)))
    }
    return {**defaults, **changed} if changed else None


def section_class(section: Any) -> str | None:
    """The class a config section names: ``model: pkg.Model`` or ``model: {class_path: pkg.Model, ...}``."""
    if isinstance(section, dict):
        return section.get("class_path")
    return section if isinstance(section, str) else None
