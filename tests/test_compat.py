"""One fast test per function of ``src/compat.py``: each fails when the library changes the private name under it."""

from __future__ import annotations

import signal
import subprocess
import sys

import lightning as L
import pytest
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel

from src.compat import stop_started_processes, subcommand_parser

# -- Lightning: the fit loop's counters and switches --------------------------------------------------------

# -- Lightning: checkpointing, strategies, launchers --------------------------------------------------------


def test_stop_started_processes_kills_the_ranks_the_ddp_launcher_started():
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False, enable_checkpointing=False)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    trainer.strategy.launcher.procs = [rank]  # what the launcher records when it starts rank 1
    stop_started_processes(trainer)
    assert rank.wait(timeout=10) == -signal.SIGKILL
    stop_started_processes(L.Trainer(accelerator="cpu", devices=1, logger=False))  # no launcher: nothing to stop


# -- jsonargparse and LightningCLI --------------------------------------------------------------------------


class Parsed(Exception):
    """Raised by the probe below once the arguments are parsed, before anything is built."""


def test_subcommand_parser_is_the_parser_that_read_the_subcommands_options():
    class Probe(LightningCLI):
        def before_instantiate_classes(self) -> None:
            raise Parsed(subcommand_parser(self, self.subcommand), self.parser)

    with pytest.raises(Parsed) as parsed:
        Probe(BoringModel, args=["fit", "--trainer.max_steps=3"])
    fit_parser, main_parser = parsed.value.args
    assert isinstance(fit_parser, LightningArgumentParser) and fit_parser is not main_parser
    assert fit_parser.get_defaults().trainer.max_steps == -1 and "ckpt_path" in fit_parser.get_defaults()
    assert fit_parser.callback_keys == [] and fit_parser.default_config_files == []  # the public attributes used


# -- torch --------------------------------------------------------------------------------------------------
