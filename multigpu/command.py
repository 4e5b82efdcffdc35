"""The project's command line as its users type it: ``python -m`` the module whose ``TemplateCLI`` runs, else the one
``pyproject.toml`` names (``[tool.multigpu] cli``), else ``src.cli``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

DEFAULT = "src.cli"
_running: str | None = None


def started_by(cli_class: type) -> None:
    """Record the module of ``cli_class``, the command line that runs (``python -m`` names it ``__main__``)."""
    global _running
    name: str | None = cli_class.__module__
    if name in ("__main__", "__mp_main__"):
        spec = getattr(sys.modules.get(name), "__spec__", None)
        name = spec.name if spec is not None else None
    if name and not name.startswith("multigpu."):
        _running = name


def configured(root: Path | str = ".") -> str:
    """The module ``pyproject.toml`` of the project at ``root`` names (``[tool.multigpu] cli``), else ``src.cli``."""
    path = Path(root) / "pyproject.toml"
    try:
        settings = tomllib.loads(path.read_text()).get("tool", {}).get("multigpu", {})
    except (OSError, tomllib.TOMLDecodeError):
        return DEFAULT
    return str(settings.get("cli", DEFAULT))


def module() -> str:
    """The command line's module: the one running, else the one the project in this folder names."""
    return _running or configured()


def prog() -> str:
    """The command as users type it, e.g. ``python -m src.cli``."""
    return f"python -m {module()}"


def running_program(main: Callable[..., object], default: str) -> str:
    """``python -m`` the module run as ``__main__`` where its ``main`` is this one (a project's may re-export the
    engine's), else ``default``."""
    running = sys.modules.get("__main__")
    spec = getattr(running, "__spec__", None)
    if getattr(running, "main", None) is main and spec is not None and spec.name:
        return f"python -m {spec.name}"
    return default
