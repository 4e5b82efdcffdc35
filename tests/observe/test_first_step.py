"""The time to the first training step, in parts (multigpu/observe/first_step.py): the command line's marks and the
run plan's, printed once by rank 0 and written into run_plan.json."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import lightning as L
import pytest

from multigpu.observe import first_step
from multigpu.observe.run_plan import RunPlan
from tests.cli import main
from tests.conftest import REPO, TINY, cli_env
from tests.fixtures.workload import TinyClassifier, TinyData

PARTS = ["imports", "engine", "model and data", "Trainer", "setup", "sanity check", "first batch", "first step"]


def test_a_fit_prints_once_the_seconds_to_its_first_step_in_named_parts_that_sum_to_the_total(tmp_path, capsys):
    main(["fit", *TINY, "--trainer.max_steps=3", "--progress_bar=none", f"--trainer.default_root_dir={tmp_path}"])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("first step after ")]
    parts = json.loads((tmp_path / "logs" / "version_0" / "run_plan.json").read_text())["first_step_s"]
    assert list(parts) == [*PARTS, "total"]
    assert all(seconds >= 0 for seconds in parts.values())
    assert sum(parts[name] for name in PARTS) == pytest.approx(parts["total"], abs=1e-9)
    assert parts["imports"] > 0.1 and parts["first step"] > 0  # the interpreter and torch, a real step
    assert printed == [first_step.line(parts)]


def test_the_process_start_is_when_the_process_started():
    """A child process says when it started, on the wall clock: after the parent started it, before its own first
    statement ran."""
    probe = (
        "import time; first = time.time(); from multigpu.observe.first_step import process_started as s;"
        " print(first, time.time() - (time.perf_counter() - s()))"
    )
    before = time.time()
    child = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=cli_env(), capture_output=True, text=True)
    first, started = (float(value) for value in child.stdout.split())
    assert before - 0.02 <= started <= first  # /proc counts in 10 ms ticks


def test_a_plain_trainer_splits_from_its_fit_on(tmp_path):
    first_step.taken()  # no command's marks: an earlier command's in this process are not this fit's
    trainer = L.Trainer(accelerator="cpu", max_steps=2, num_sanity_val_steps=0, logger=False, callbacks=[RunPlan()],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(TinyClassifier(), TinyData())
    plan = next(callback for callback in trainer.callbacks if isinstance(callback, RunPlan)).plan
    parts = plan["first_step_s"]
    assert list(parts) == ["setup", "first batch", "first step", "total"]
    assert sum(parts[name] for name in ("setup", "first batch", "first step")) == pytest.approx(parts["total"])
    assert json.loads((tmp_path / "run_plan.json").read_text())["first_step_s"] == parts  # in its own folder
