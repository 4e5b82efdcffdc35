"""Where a process runs (multigpu/facts/environment.py): how it was launched, told from the variables SLURM and torchrun
set (their real values are checked on a real cluster in tests/workflows/test_slurm.py), and the devices asked for."""

from __future__ import annotations

import os

import pytest
from lightning.fabric.plugins.environments import SLURMEnvironment

from multigpu.facts import environment
from multigpu.facts.environment import NODE_LAUNCH_ENV, Launch, SlurmTasks, this_launch


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in [*os.environ]:
        if name.startswith(("SLURM_", "TORCHELASTIC_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_a_batch_script_a_step_and_an_interactive_job_are_told_apart(no_launcher):
    assert not environment.in_slurm_batch_script() and not environment.in_slurm_step()
    no_launcher.setenv("SLURM_JOB_ID", "7")
    no_launcher.setenv("SLURM_NTASKS", "2")
    assert environment.in_slurm_batch_script() and not environment.started_by_srun()
    no_launcher.setenv("SLURM_STEP_ID", "batch")  # the batch step is no srun step
    assert environment.in_slurm_batch_script()
    no_launcher.setenv("SLURM_STEP_ID", "0")
    assert environment.started_by_srun() and environment.in_slurm_step()
    no_launcher.setenv("SLURM_JOB_NAME", "interactive")  # srun --pty bash: the command is typed inside it
    assert environment.interactive_job() and not environment.in_slurm_step()
    assert not environment.launched_by_torchrun()


def test_the_launch_is_named_once_from_the_same_variables(no_launcher):
    assert environment.launch_kind() == "plain"
    no_launcher.setenv("SLURM_JOB_ID", "7")
    no_launcher.setenv("SLURM_NTASKS", "2")
    assert environment.launch_kind() == "sbatch"
    no_launcher.setenv("SLURM_STEP_ID", "0")
    assert environment.launch_kind() == "srun"
    no_launcher.setenv("SLURM_JOB_NAME", "interactive")
    assert environment.launch_kind() == "interactive_srun"  # Lightning ignores SLURM's ranks in salloc's job
    no_launcher.setenv("TORCHELASTIC_RUN_ID", "x")  # torchrun inside an srun step: torchrun's ranks win
    assert environment.launch_kind() == "torchrun"


def test_the_ranks_are_slurms_exactly_where_lightnings_slurm_environment_detects_the_job(no_launcher):
    def slurm_ranks() -> bool:
        told = this_launch().slurm_ranks
        assert told is (SLURMEnvironment.detect() and not environment.launched_by_torchrun())  # Lightning's rule
        return told

    assert not slurm_ranks()
    no_launcher.setenv("SLURM_JOB_ID", "7")
    assert not slurm_ranks()  # a batch script of a job without a task count: Lightning ignores SLURM
    no_launcher.setenv("SLURM_NTASKS", "2")
    assert slurm_ranks()  # the batch script of `sbatch --ntasks=2`
    no_launcher.setenv("SLURM_STEP_ID", "0")
    assert slurm_ranks()
    no_launcher.setenv("SLURM_JOB_NAME", "interactive")
    assert not slurm_ranks()
    no_launcher.setenv("SLURM_JOB_NAME", "train")
    no_launcher.setenv("TORCHELASTIC_RUN_ID", "x")  # torchrun inside the step: Lightning takes torchrun's ranks
    assert not slurm_ranks()


def test_the_launch_a_process_belongs_to_is_told_from_its_launchers_variables(no_launcher, tmp_path):
    for name in ("RANK", "LOCAL_RANK", "SWEEP_DIR", "SWEEP_TRIAL", *NODE_LAUNCH_ENV):  # an earlier ddp test's too
        no_launcher.delenv(name, raising=False)
    assert this_launch() == Launch()  # a plain command: it launches, and holds its run directory
    no_launcher.setenv("LOCAL_RANK", "1")  # a rank that Lightning's launcher started
    assert this_launch() == Launch(rank=1)
    no_launcher.delenv("LOCAL_RANK")
    slurm = {"SLURM_JOB_ID": "81", "SLURM_PROCID": "3", "SLURM_ARRAY_JOB_ID": "80", "SLURM_ARRAY_TASK_ID": "1"}
    for name, value in slurm.items():
        no_launcher.setenv(name, value)
    job = "SLURM job 81 (array task 80_1)"
    assert this_launch() == Launch(
        "sbatch", rank=0, job=job, slurm=SlurmTasks()
    )  # the batch script: srun started nothing
    for name, value in {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_RESTART_COUNT": "2"}.items():
        no_launcher.setenv(name, value)
    no_launcher.setenv("SWEEP_DIR", str(tmp_path))
    no_launcher.setenv("SWEEP_TRIAL", "5")
    trial = f"{tmp_path} trial 5"
    tasks = SlurmTasks(tasks=4)
    assert this_launch() == Launch("srun", 3, job, "step 0", start=2, trial=trial, slurm_ranks=True, slurm=tasks)
    torchrun = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    for name, value in {**torchrun, "TORCHELASTIC_RESTART_COUNT": "1"}.items():
        no_launcher.setenv(name, value)
    torchrun_launch = Launch(
        "torchrun", 1, "torchrun run abc at n1:29500", None, 1, trial, slurm=tasks, node_launcher=True
    )
    assert this_launch() == torchrun_launch  # torchrun wins


def test_the_devices_asked_for_are_counted_as_lightning_counts_them():
    assert environment.requested_devices("auto", "cpu") == 1
    assert environment.requested_devices("0,1,", "cuda") == 2
    assert environment.requested_devices([0, 2, 3], "cuda") == 3
    assert environment.requested_devices("4", "cpu") == 4
    assert environment.requested_devices(-1, "cpu") == environment.available_devices("cpu")
    assert environment.requested_devices("many", "cpu") is None
    assert environment.resolve_accelerator("gpu") == "cuda"


def test_the_world_size_counts_one_process_per_device_only_where_the_strategy_starts_them():
    assert environment.world_size("ddp", 4, 2) == 8
    assert environment.world_size("dp", 4, 1) == 1  # one process drives every GPU
