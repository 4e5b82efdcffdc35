"""The engine's callbacks (``multigpu/callbacks/__init__.py``): ``--callbacks_off`` leaves optional ones out of a run
(their order: ``tests/test_run.py``). Each callback's own test is beside this one."""

from __future__ import annotations

import csv

import pytest

from multigpu.callbacks import PreemptionCheckpoint, RunPlan, SpeedMonitor
from multigpu.callbacks.continuation import ExactContinuation
from tests.cli import TemplateCLI, main
from tests.conftest import TINY


def test_a_switched_off_callback_does_not_run(tmp_path):
    run_dir = tmp_path / "run"
    main([
        "fit", *TINY, "--trainer.max_steps=4", "--trainer.log_every_n_steps=2", "--trainer.limit_val_batches=1",
        "--progress_bar=none", "--callbacks_off=[throughput,run_plan]", f"--trainer.default_root_dir={run_dir}",
    ])  # fmt: skip
    rows = list(csv.DictReader((run_dir / "logs" / "version_0" / "metrics.csv").open()))
    assert any(row.get("train/loss") for row in rows)  # the run logged its loss at steps 2 and 4 ...
    assert not [name for name in rows[0] if name.startswith("perf/")]  # ... without the throughput figures
    assert not list(run_dir.rglob("run_plan.json"))
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_the_trainer_holds_the_listed_callbacks_less_those_switched_off():
    def kinds(*args: str) -> set[type]:
        return {type(callback) for callback in TemplateCLI(args=[*TINY, *args], run=False).trainer.callbacks}

    everything = kinds()
    assert {PreemptionCheckpoint, SpeedMonitor, RunPlan, ExactContinuation} <= everything
    fewer = kinds("--callbacks_off=[preemption,throughput]")
    assert everything - fewer == {PreemptionCheckpoint, SpeedMonitor}


def test_an_unknown_name_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        TemplateCLI(args=[*TINY, "--callbacks_off=[thruput]"], run=False)
    assert stop.value.code == 2
    assert "callbacks_off" in capsys.readouterr().err
