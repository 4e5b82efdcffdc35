"""The engine's callbacks (``multigpu/callbacks/__init__.py``): the one list in the order they run, and
``--callbacks_off`` leaving optional ones out of a run (the order a Trainer holds: ``tests/test_run.py``). Each
callback's own test is beside this one."""

from __future__ import annotations

import csv
import inspect

import pytest
from jsonargparse import Namespace

from multigpu.callbacks import CALLBACK_OPTIONS, PreemptionCheckpoint, RunPlan, SpeedMonitor, run_callbacks
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


def test_the_one_list_orders_the_callbacks_with_a_comment_per_line_and_their_switches():
    listed = inspect.getsource(run_callbacks).split("callbacks = [\n")[1].split("\n    ]")[0].splitlines()
    assert len(listed) > 15 and all("  # " in line for line in listed), listed  # each entry says what it is for
    options = Namespace(callbacks_off=["straggler"], progress_bar="plain", compile=True, batch_size_per_process=False)
    built = Namespace(trainer=Namespace(callbacks=[], max_time="00:00:01:00"))
    for name, callback_class in CALLBACK_OPTIONS.items():
        built[name] = callback_class()
    callbacks, switches, off = run_callbacks(options, built)
    assert [type(callback).__name__ for callback in callbacks] == [
        "SpeedMonitor", "PlainProgressBar", "ModelSummary", "CompileModel", "EngineLoaders", "ExactContinuation",
        "RandomState", "RunTimer", "PreemptionCheckpoint", "RunPlan", "NonFiniteLossGuard", "RunCheckpoint",
        "PrecisionBeforeRestore", "Float64Metrics", "StackDumps", "StopOtherRanksOnError", "UnshareSpawnedTensors",
        "DestroyProcessGroupAtExit",
    ]  # fmt: skip
    assert switches == {"enable_model_summary": False, "max_time": None}  # Lightning's own replaced
    assert off == {"straggler"}
