"""The template's callbacks: every one is listed in ``src/callbacks/__init__.py``, and ``--callbacks_off`` leaves
optional ones out of a run; under SLURM Lightning's own save-and-requeue gives way to ``PreemptionCheckpoint``."""

from __future__ import annotations

import csv

import pytest
from lightning.fabric.plugins.environments import SLURMEnvironment

import src.callbacks
from src.callbacks import OPTIONAL_CALLBACKS, PreemptionCheckpoint, RunPlan, SpeedMonitor
from src.callbacks.continuation import ExactContinuation
from src.callbacks.steps import EveryNSteps
from src.cli import TemplateCLI, main
from tests.conftest import TINY


def test_the_trainer_holds_the_callbacks_in_the_listed_order_and_every_switch_is_listed():
    listing = src.callbacks.__doc__
    for name in OPTIONAL_CALLBACKS:
        assert f"- ``{name}``: " in listing, name
    args = [*TINY, "--trainer.enable_model_summary=true", "--progress_bar=plain", "--trainer.max_time=00:00:01:00"]
    cli = TemplateCLI(args=[*args, "--trainer.callbacks+=tests.helpers.Pace"], run=False)
    held = [type(callback).__name__ for callback in cli.trainer.callbacks]
    assert held[0] == "Pace"  # the user's own first
    held = [name for name in held[1:] if name != "SaveConfigCallback"]  # LightningCLI's, which saves config.yaml
    listed = sorted(held, key=lambda name: listing.index(f"``{name}``"))
    assert held == listed  # in the listed order, ModelCheckpoint last
    assert held[-1] == "RunCheckpoint"
    for name in ("CompileModel", "ClipAcrossMeshes", "ExactContinuation", "RandomState", "RunTimer"):
        assert f"``{name}``" in listing, name


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


@pytest.fixture
def under_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of one task started by ``srun`` (what Lightning detects SLURM by)."""
    for name, value in {
        "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "node1", "SLURM_NTASKS_PER_NODE": "1",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)


def test_under_slurm_lightnings_requeue_is_off_while_preemption_handles_signals(under_slurm):
    def environment(*args: str) -> SLURMEnvironment:
        cli = TemplateCLI(args=[*TINY, "--trainer.strategy=ddp", *args], run=False)
        return cli.trainer.strategy.cluster_environment

    assert environment().auto_requeue is False
    assert environment("--callbacks_off=[preemption]").auto_requeue is True  # Lightning's own handling instead


def test_every_n_steps_is_due_when_a_multiple_is_crossed():
    every = EveryNSteps(5, start=3)  # resumed at step 3
    assert [step for step in (4, 5, 5, 6, 9, 11, 12, 15) if every.due(step)] == [5, 11, 15]
    new_step = EveryNSteps()
    assert [step for step in (0, 0, 1, 1, 3) if new_step.due(step)] == [0, 1, 3]
    assert not EveryNSteps(0).due(100)
