"""A default run prints nothing a newcomer must learn to ignore (multigpu/errors/quiet.py).

The runs capture a real run's stdout and stderr without the test suite's warning filters and look for each line of
Lightning's and PyTorch's that said nothing about the run. A ddp run stopped and resumed prints none on any rank
either: that run is ``tests/faults/test_preemption.py``'s SIGTERM to rank 0 of ddp, which checks its output with
``assert_no_noise``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import prewarmed
from tests.conftest import REPO, TINY, cli_env

# -- a default run is quiet ------------------------------------------------------------------------------------

#: what every run printed that said nothing about the run, by the words that identify each line
NOISE = {
    "srun hint outside SLURM": "The `srun` command is available on your system but is not used",
    "litlogger advertisement": "litlogger",
    "zero FLOPs": "Total FLOPs: 0",
    "torch pytree deprecation in Lightning": "LeafSpec",
    "weights_only unset at a save": "`weights_only` was not set",
    "non-empty checkpoint folder on a resume": "exists and is not empty",
    "Lightning skipping its own summary": "Trainer already configured with model summary callbacks",
    "a sync_dist hint for metrics already reduced": "sync_dist=True)` when logging on epoch level",
}
#: the template's warning for a --checkpoint.monitor the model does not log: noise before the first validation
MISSING_MONITOR = "is not logged by this model"
#: the tests' workload with its model summary on (tiny.yaml turns it off), as a newcomer's run would have it
QUIET_RUN = [*TINY, "--trainer.enable_model_summary=true"]


def newcomer_env_in(folder: Path) -> dict[str, str]:
    """A newcomer's environment: no warning filters of the test suite, and `srun` (written into ``folder``/bin) on
    PATH outside any job."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    del env["PYTHONWARNINGS"]  # cli_env ignores DeprecationWarning, which a newcomer's shell does not
    return env


@pytest.fixture
def newcomer_env(tmp_path) -> dict[str, str]:
    return newcomer_env_in(tmp_path)


def assert_no_noise(output: str) -> None:
    found = {name: words for name, words in NOISE.items() if words in output}
    assert not found, f"noise in the output: {found}\n{output}"


def run_quietly(env: dict[str, str], *args: str, code: int = 0) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "tests.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    output = result.stdout + result.stderr
    assert result.returncode == code, output[-4000:]
    assert_no_noise(output)
    return output


def test_the_noise_sources_still_print_without_the_filters(newcomer_env):
    """The filters' other half: these libraries still print each line, so each filter still has a job (when one
    of them fails, Lightning or PyTorch dropped that line: delete its filter in multigpu/errors/quiet.py)."""
    script = (
        "import logging, warnings; warnings.simplefilter('default')\n"
        "from lightning.fabric.plugins.environments import SLURMEnvironment\n"
        "SLURMEnvironment.detect()\n"
        "from lightning.pytorch.utilities._pytree import _tree_flatten\n"
        "_tree_flatten(1)\n"
        "import lightning as L\n"
        "L.Trainer(accelerator='cpu', logger=False, enable_checkpointing=False)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], env=newcomer_env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for name in ("srun hint outside SLURM", "torch pytree deprecation in Lightning", "litlogger advertisement"):
        assert NOISE[name] in result.stderr, (name, result.stderr)


def test_a_run_a_stop_a_resume_and_an_evaluation_print_no_noise(tmp_path, newcomer_env):
    run_dir = tmp_path / "run"
    # 10 steps end before the first validation (16 steps per epoch): val/loss is not known yet, not missing
    args = [*QUIET_RUN, f"--trainer.default_root_dir={run_dir}", "--trainer.max_steps=10"]
    stop = ["--trainer.callbacks+=tests.helpers.SignalAtStep", "--trainer.callbacks.step=3"]
    stopped = run_quietly(newcomer_env, "fit", *args, *stop, code=75)
    assert "preempted: SIGUSR1: saved" in stopped
    # the summary: no FLOPs column, and the model's own training FLOPs per sample: 6 x (16 x 32 + 32 x 4)
    header = next(line for line in stopped.splitlines() if "┃ Name" in line)
    assert "FLOPs" not in header and "Training FLOPs per sample (the model's flops_per_sample): 3.8 K" in stopped
    resumed = run_quietly(newcomer_env, "fit", *args, "--ckpt_path=last")
    assert "Restored all states from the checkpoint" in resumed and MISSING_MONITOR not in resumed
    checkpoint = str(run_dir / "checkpoints" / "last.ckpt")
    for subcommand, metric in (("validate", "val/acc"), ("test", "test/acc")):
        evaluated = run_quietly(newcomer_env, subcommand, *QUIET_RUN, f"--trainer.default_root_dir={run_dir}",
                                f"--ckpt_path={checkpoint}")  # fmt: skip
        assert metric in evaluated


@pytest.mark.slow
def test_real_warnings_still_show_once_under_ddp(tmp_path, newcomer_env):
    """Lightning's note that 16-mixed runs as bf16 on a CPU, and a monitor the model never logs, after a
    validation that would have logged it: each said once, by rank 0 of two ddp processes."""
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2"]
    args = [*QUIET_RUN, *ddp, f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=16"]
    output = run_quietly(newcomer_env, "fit", *args, "--trainer.precision=16-mixed", "--checkpoint.monitor=val/nope")
    assert output.count("AMP with fp16 is not supported on CPU. Using `precision='bf16-mixed'` instead.") == 1
    assert output.count(f"--checkpoint.monitor=val/nope {MISSING_MONITOR}") == 1


# -- nothing after a command's own output -------------------------------------------------------------------------

#: commands that end three ways: the help, a one-paragraph error, a fit; each with its exit status
ENDINGS = {
    "help": (["fit", "--help"], 0),
    "error paragraph": (["fit", *TINY, "--trainer.max_steps=abc"], 2),
    "fit": (["fit", *TINY, "--trainer.max_steps=1"], 0),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_commands_output_ends_where_its_own_text_ends(ending, tmp_path):
    """Nothing is printed at exit: an extension that counts its objects still alive when the interpreter ends (the
    triton of torch's CUDA builds, whose nanobind reported about 30 leaked objects after every command) finds none.
    """
    args, code = ENDINGS[ending]
    result = prewarmed.run(
        [sys.executable, "-m", "tests.cli", *args, f"--trainer.default_root_dir={tmp_path}"],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == code, result.stderr[-4000:]
    last_line = result.stderr.rstrip("\n").rsplit("\n", 1)[-1]
    if ending == "help":
        assert result.stderr == "" and "--trainer.max_steps" in result.stdout
    elif ending == "error paragraph":
        assert result.stderr.startswith('error: Parser key "trainer.max_steps"'), result.stderr
        assert last_line.startswith("Fix: "), result.stderr
    else:
        assert last_line == "`Trainer.fit` stopped: `max_steps=1` reached.", result.stderr
        assert result.stdout.rstrip().rsplit("\n", 1)[-1].startswith("done  epoch 1 step 1/1"), result.stdout
