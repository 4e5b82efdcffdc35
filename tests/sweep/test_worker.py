"""One sweep worker (multigpu/sweep/worker.py): a trial's loggers, and, slow, whole sweeps of the tests' workload: a
worker
stopped by a signal and run again resumes its trial, failed trials are recorded with their message."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from optuna.trial import TrialState

from multigpu.sweep import spec as sweep_spec
from multigpu.sweep.study import ERROR_ATTR, STEPS_ATTR, Sweep, run_dir
from multigpu.sweep.worker import logger_flags
from tests import prewarmed
from tests.cli import main as cli_main
from tests.conftest import REPO, TINY, cli_env, project_folder, read_metrics
from tests.helpers import hold_at, wait_for
from tests.sweep.conftest import (
    BATCH,
    LR,
    MAX_STEPS,
    assert_resumed_once,
    final_step,
    sweep_cli,
    trained_steps,
    write_sweep,
)


def test_wandb_logger_gets_the_sweep_group_and_trial_name(run_cli: Any, tmp_path: Path) -> None:
    logger = yaml.safe_load((REPO / "configs" / "logger" / "wandb.yaml").read_text())["trainer"]["logger"]
    flags = logger_flags(logger, "lr-sweep", "lr-sweep-trial-0003")
    assert logger_flags({"class_path": "lightning.pytorch.loggers.CSVLogger"}, "g", "n") == []
    trial_config = run_cli("fit", *TINY, "--config", "configs/logger/wandb.yaml", *flags, "--print_config")
    init_args = yaml.safe_load(trial_config.stdout)["trainer"]["logger"]["init_args"]
    assert (init_args["group"], init_args["name"]) == ("lr-sweep", "lr-sweep-trial-0003")
    assert init_args["project"] == "lightning-multigpu-template"  # the rest of the logger's config is kept


@pytest.mark.slow
@pytest.mark.extended
def test_stopped_worker_resumes_its_trial_and_the_sweep_completes_once(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, trials=2)
    sweep_dir, held = tmp_path / "sweep", tmp_path / "held"
    first = prewarmed.popen(
        [sys.executable, "-m", "multigpu.sweep", "run", str(path), "--dir", str(sweep_dir), "--", *hold_at(3, held)],
        cwd=project_folder(), env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for(held.exists, "trial 0 held at step 3", process=first)
    first.send_signal(signal.SIGTERM)  # the worker passes it to its fit run, which saves and stops
    output = first.communicate(timeout=120)[0]
    assert first.returncode == 143, output
    assert "sweep: worker 0: trial 0 stopped by SIGTERM; the next `run` resumes it" in output
    stopped_at = final_step(run_dir(sweep_dir, 0))
    assert 3 <= stopped_at < MAX_STEPS

    again = sweep_cli("run", str(path), "--dir", str(sweep_dir))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "trial 0 resumed" in again.stdout and "trial 1" in again.stdout and "trial 2" not in again.stdout
    trial0 = run_dir(sweep_dir, 0)
    assert f"Restoring states from the checkpoint path at {trial0}/checkpoints/last.ckpt" in again.stdout
    study = Sweep(sweep_spec.load(path), sweep_dir).study
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    for trial in trials:  # each trial trained its full steps exactly once
        folder = run_dir(sweep_dir, trial.number)
        assert final_step(folder) == MAX_STEPS and trial.user_attrs[STEPS_ATTR] == MAX_STEPS
        if trial.number != 0:
            assert trained_steps(folder) == list(range(MAX_STEPS)), trial.number
        assert sorted(trial.intermediate_values) == [4, 8] and trial.value == trial.intermediate_values[8]
    assert sorted(p.name for p in (trial0 / "logs").iterdir()) == ["version_0", "version_1"]
    assert_resumed_once(trial0, stopped_at)
    assert trials[0].user_attrs["starts"] == 2 and all(t.user_attrs["starts"] == 1 for t in trials[1:])

    # a trial's config.yaml is the whole run: fit --config trains the same model again, in another directory
    config_file = run_dir(sweep_dir, 1) / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == trials[1].params[LR]
    assert config["data"]["init_args"]["batch_size"] == trials[1].params[BATCH] and config["ckpt_path"] is None
    again_dir = tmp_path / "again"
    cli_main(["fit", "--config", str(config_file), f"--trainer.default_root_dir={again_dir}"])
    val_loss = [
        [r["val/loss"] for r in read_metrics(d) if r.get("val/loss")] for d in (run_dir(sweep_dir, 1), again_dir)
    ]
    assert len(val_loss[0]) == 2 and val_loss[0] == val_loss[1]
    assert not (run_dir(sweep_dir, 1) / "logs" / "version_1").exists()  # nothing written into the trial's directory

    done = sweep_cli("run", str(path), "--dir", str(sweep_dir))
    assert done.returncode == 0 and f"{sweep_dir} is complete: 2 of 2 trials (2 complete); nothing to do" in done.stdout
    assert "Run plan" not in done.stdout  # nothing started, not even the dry run


@pytest.mark.slow
@pytest.mark.extended
def test_failed_trials_are_recorded_with_their_message_and_not_retried(tmp_path: Path) -> None:
    """Two workers (processes) on the 2 CPUs, one trial each, both failing at their first validation."""
    path = write_sweep(tmp_path, trials=2, objective={"metric": "val/lost", "mode": "min"})
    sweep_dir = tmp_path / "sweep"
    result = sweep_cli("run", str(path), "--dir", str(sweep_dir), "--workers", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 worker(s), 1 cpu device(s) per trial" in result.stdout
    assert "sweep: worker 0: trial" in result.stdout and "sweep: worker 1: trial" in result.stdout
    assert "[trial 0] Run plan" in result.stdout and "[trial 1] Run plan" in result.stdout  # whose line is whose
    trials = Sweep(sweep_spec.load(path), sweep_dir).study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL] * 2
    for trial in trials:
        message = trial.user_attrs[ERROR_ATTR]
        assert message.startswith("exit status 2: error: the sweep's objective val/lost is not logged at validation")
        assert "(logged: train/loss, val/acc, val/acc_best, val/loss). Fix: set objective:" in message
        assert not list((run_dir(sweep_dir, trial.number) / "checkpoints").glob("best-*"))  # stopped at once
    again = sweep_cli("run", str(path), "--dir", str(sweep_dir))
    assert "is complete: 2 of 2 trials (2 failed); nothing to do" in again.stdout
    report_run = sweep_cli("report", str(sweep_dir), "--no-plot")
    assert report_run.returncode == 0 and "| 0 | fail |" in report_run.stdout and "| 1 | fail |" in report_run.stdout
    assert report_run.stdout.splitlines()[-1] == "sweep: no trial is complete yet"
