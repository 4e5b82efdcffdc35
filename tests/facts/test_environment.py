"""Where a process runs (multigpu/facts/environment.py): how it was launched, told from the variables SLURM and torchrun
set (their real values are checked on a real cluster in tests/workflows/test_slurm.py), and the devices asked for."""

from __future__ import annotations

import os

import pytest

from multigpu.facts import environment


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
    assert environment.launch() == "plain"
    no_launcher.setenv("SLURM_JOB_ID", "7")
    no_launcher.setenv("SLURM_NTASKS", "2")
    assert environment.launch() == "sbatch"
    no_launcher.setenv("SLURM_STEP_ID", "0")
    assert environment.launch() == "srun"
    no_launcher.setenv("SLURM_JOB_NAME", "interactive")
    assert environment.launch() == "interactive_srun"  # Lightning ignores SLURM's ranks in salloc's job
    no_launcher.setenv("TORCHELASTIC_RUN_ID", "x")  # torchrun inside an srun step: torchrun's ranks win
    assert environment.launch() == "torchrun"


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
