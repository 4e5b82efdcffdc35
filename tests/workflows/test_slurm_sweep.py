"""slurm/sweep.sbatch on the CI cluster (``bash slurm/ci/start_cluster.sh``; see test_slurm.py): a sweep as a
job array, one worker per array task, with a task preempted in the middle of a trial."""

from __future__ import annotations

import re

import pytest
from optuna.trial import TrialState

from multigpu.sweep import spec as sweep_spec
from multigpu.sweep.study import Sweep, run_dir
from tests.conftest import project_folder
from tests.sweep.conftest import MAX_STEPS, assert_resumed_once, trained_steps, write_sweep
from tests.workflows.test_slurm import Jobs, completed, final_step, jobs, slurm  # noqa: F401  (fixtures)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.extended
def test_sweep_array_with_a_preempted_task_runs_every_trial_once(jobs: Jobs) -> None:  # noqa: F811
    """4 trials, 2 array tasks. The first trial to reach step 3 gets SIGUSR1 (what SLURM sends before a time
    limit or a preemption): its run saves, its task requeues itself, and that trial is resumed from its
    checkpoint, by the requeued task or by the other one, whichever claims it first."""
    folder = jobs.folder
    sweep_file = write_sweep(folder, trials=4)
    sweep_dir = folder / "sweep"
    probe = [
        "--trainer.callbacks+=tests.fixtures.sweep_probes.SignalOnce",
        "--trainer.callbacks.step=3",
        f"--trainer.callbacks.marker={folder / 'preempted'}",
    ]
    job = jobs.submit(
        "slurm/sweep.sbatch",
        "--array=0-1",
        "--cpus-per-task=1",
        ACCELERATOR="cpu",
        SWEEP_FILE=str(sweep_file),
        SWEEP_DIR=str(sweep_dir),
        EXTRA_ARGS=" ".join(probe),
        REPO=str(project_folder()),  # the sweep's trials run the command line its pyproject.toml names
    )
    records = jobs.wait(job, timeout=300)
    completed(records, jobs)
    log = jobs.logs()
    assert sorted(r["Restarts"] for r in records) == ["0", "1"], log  # one task requeued, once
    assert "preempted: the trial saved its last.ckpt" in log and "requeueing job" in log
    assert len(re.findall(r"trial \d+ preempted \(SIGUSR1\)", log)) == 1

    trials = Sweep(sweep_spec.load(sweep_file), sweep_dir).study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4, log
    resumed = [t for t in trials if t.user_attrs["starts"] == 2]
    assert len(resumed) == 1 and all(t.user_attrs["starts"] == 1 for t in trials if t not in resumed)
    for trial in trials:  # every trial trained its full step count
        assert final_step(run_dir(sweep_dir, trial.number)) == MAX_STEPS
        if trial not in resumed:
            assert trained_steps(run_dir(sweep_dir, trial.number)) == list(range(MAX_STEPS)), trial.number
    stopped = run_dir(sweep_dir, resumed[0].number)
    assert sorted(p.name for p in (stopped / "logs").iterdir()) == ["version_0", "version_1"]
    (saved,) = map(int, re.findall(rf"saved {stopped}/checkpoints/last\.ckpt at step (\d+)", log))
    assert saved == 3
    assert_resumed_once(stopped, saved)
    assert f"Restoring states from the checkpoint path at {stopped}/checkpoints/last.ckpt" in log
    assert f"trial {resumed[0].number} resumed" in log
    assert not (sweep_dir / "trial-0004").exists()  # no trial drawn in place of the stopped one
