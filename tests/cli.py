"""The tests' own command line, ``python -m tests.cli {fit,validate,test,predict,tune} ...``: the engine's
``TemplateCLI`` subclassed as a project subclasses it, with the tests' default config (tests/configs/default.yaml)
read first. The engine's tests run it, so that they need none of this repository's example project (``src/``)."""

from __future__ import annotations

from pathlib import Path

from multigpu import TemplateCLI, run_cli


class CLI(TemplateCLI):
    """The engine's command line with the tests' defaults; ``CLI(args=[...], run=False)`` builds without running."""

    default_config = Path(__file__).resolve().parent / "configs" / "default.yaml"


DEFAULT_CONFIG = CLI.default_config


def main(args: list[str] | None = None) -> None:
    """Run a subcommand with ``args`` (default: the command line's); exits 2 on a configuration error."""
    run_cli(args, CLI)


if __name__ == "__main__":
    main()
