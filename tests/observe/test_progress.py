"""Progress output (multigpu/observe/progress.py): plain lines off a terminal, one each ``every_n_steps`` steps, after
each validation and at the end; Rich on a terminal; both with the throughput figures."""

from __future__ import annotations

import re
import traceback

import lightning as L
import pytest
import torch

from multigpu.observe.progress import PlainProgressBar, TemplateRichProgressBar, progress_bar
from multigpu.observe.throughput import SpeedMonitor
from tests.fixtures.workload import TinyClassifier, TinyData


def test_auto_is_plain_lines_off_a_terminal():
    assert progress_bar("none") is None
    assert isinstance(progress_bar("rich"), TemplateRichProgressBar)
    assert type(progress_bar("plain")) is type(progress_bar("auto")) is PlainProgressBar  # pytest's output is a pipe


def test_the_plain_bar_prints_at_each_multiple_of_its_steps_after_each_validation_and_at_the_end(capsys):
    trainer = L.Trainer(
        accelerator="cpu", max_steps=4, val_check_interval=2, limit_val_batches=1, num_sanity_val_steps=1,
        callbacks=[PlainProgressBar(every_n_steps=3)], logger=False, enable_checkpointing=False,
        enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(TinyClassifier(), datamodule=TinyData())
    lines = [line for line in capsys.readouterr().out.splitlines() if re.match(r"(train|val|done) ", line)]
    # the sanity check prints nothing; step 3 is the one multiple of 3 crossed; validations at steps 2 and 4
    positions = [re.match(r"(\w+) +epoch \d step (\d+)/4 \[\d+\.\ds\]", line).groups() for line in lines]
    assert positions == [("val", "2"), ("train", "3"), ("val", "4"), ("done", "4")], lines
    assert all("val/loss=" in line for line in lines if line.startswith("val"))


@pytest.mark.parametrize("mode", ["plain", "rich"])
def test_both_progress_bars_show_the_throughput_figures(mode):
    """The figures do not pass through ``self.log``, so the template's bars add them themselves."""
    monitor, bar = SpeedMonitor(), progress_bar(mode)
    trainer = L.Trainer(callbacks=[monitor, bar], logger=False, enable_checkpointing=False)
    monitor.shown = {"perf/samples_per_s": 123.0}
    assert bar.get_metrics(trainer, TinyClassifier())["perf/samples_per_s"] == 123.0


@pytest.mark.parametrize("mode", ["plain", "rich"])
def test_the_training_loss_is_shown_and_read_off_the_device_once_per_logged_value(mode, monkeypatch, capsys):
    """A ``prog_bar`` loss would be turned into a number by Lightning after every batch: a GPU sync per step."""
    reads: list[str] = []

    def counting(real):
        def read(tensor: torch.Tensor):
            sites = {frame.filename.rsplit("/", 1)[-1] for frame in traceback.extract_stack()}
            if sites & {"progress.py", "result.py", "logger_connector.py"}:
                reads.append(real.__name__)
            return real(tensor)

        return read

    monkeypatch.setattr(torch.Tensor, "item", counting(torch.Tensor.item))
    monkeypatch.setattr(torch.Tensor, "__float__", counting(torch.Tensor.__float__))
    trainer = L.Trainer(
        accelerator="cpu", max_steps=6, log_every_n_steps=2, limit_val_batches=0, callbacks=[progress_bar(mode)],
        logger=False, enable_checkpointing=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(TinyClassifier(), datamodule=TinyData())
    assert 1 <= len(reads) <= 3, reads  # the losses of steps 2, 4 and 6, each once: not one per step
    if mode == "plain":
        assert re.search(r"done +epoch \d step 6/6 .*train/loss=\d", capsys.readouterr().out)
