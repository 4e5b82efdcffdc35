"""This project's command line: ``python -m src.cli {fit,validate,test,predict,tune} [--config FILE ...]
[--key=value ...]``, the engine's with ``configs/default.yaml`` read first (README "The command line")."""

from __future__ import annotations

from pathlib import Path

from multigpu import TemplateCLI, run_cli


class CLI(TemplateCLI):
    """The engine's command line with this project's defaults; in a script or notebook:
    ``CLI(args=["--trainer.max_steps=10"], run=False)`` builds the model, data module and Trainer without running."""

    default_config = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


DEFAULT_CONFIG = CLI.default_config


def main(args: list[str] | None = None) -> None:
    """Run a subcommand with ``args`` (default: the command line's); exits 2 on a configuration error."""
    run_cli(args, CLI)


if __name__ == "__main__":
    main()
