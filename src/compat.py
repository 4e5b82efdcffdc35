"""Every private name of Lightning, jsonargparse and torch that the template relies on, in one place.

Each is a small function with a one-line reason; ``tests/test_compat.py`` has a fast test for each that fails
loudly when a library release renames or changes it. Nothing else in ``src/`` reaches into another object's
internals, so an upgrade of Lightning is checked by running that one test file.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

if TYPE_CHECKING:
    import lightning as L
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

# -- Lightning: the fit loop's counters and switches --------------------------------------------------------

# -- Lightning: checkpointing, strategies, launchers --------------------------------------------------------


def stop_started_processes(trainer: L.Trainer, signum: signal.Signals = signal.SIGKILL) -> None:
    """Signal the ddp ranks this process started (none where it was started itself): the ``ddp`` launcher's
    class is private (``_SubprocessScriptLauncher``); its ``kill`` is what Lightning itself calls on Ctrl-C."""
    launcher = trainer.strategy.launcher
    if isinstance(launcher, _SubprocessScriptLauncher):
        launcher.kill(signum)


# -- jsonargparse and LightningCLI --------------------------------------------------------------------------


def subcommand_parser(cli: LightningCLI, subcommand: str | None) -> LightningArgumentParser:
    """The parser of one subcommand (``fit``, ...), or the only one without subcommands: LightningCLI keeps them in
    its private ``_parser`` (its ``callback_keys`` and ``default_config_files`` are public)."""
    return cli._parser(subcommand)


# -- torch --------------------------------------------------------------------------------------------------
