"""Errors name their real cause, and a default run prints nothing a newcomer must learn to ignore.

A network or file-system failure in a data module or a constructor is reported as what it is, by its type (no
network; disk full, permission denied or file not found with the path), exit status 1, and never as a wrong
option; any other exception of the user's code keeps its traceback. The runs of the second half capture a real
run's stdout and stderr without the test suite's warning filters and look for each line of Lightning's and
PyTorch's that said nothing about the run. A ddp run stopped and resumed prints none on any rank either: that run
is ``tests/callbacks/test_preemption.py``'s SIGTERM to rank 0 of ddp, which checks its output with
``assert_no_noise``.
"""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from multigpu.checkpoints import files
from multigpu.errors import DEBUG_ENV
from multigpu.failures import user_error_of
from tests import prewarmed
from tests.cli import main
from tests.conftest import REPO, TINY, cli_env
from tests.fixtures.workload import TinyClassifier, TinyData

#: a host that never resolves (RFC 2606 reserves .invalid), so the download fails with or without a network
UNREACHABLE_URL = "http://data.invalid/dataset.tar.gz"


class FailingData(TinyData):
    """Test-only: the tests' data module whose ``prepare_data`` fails the way a real download or file write does.

    Args:
        failure: ``network`` (fetch from a host that does not resolve), ``disk_full`` (write to /dev/full),
            ``permission`` (a PermissionError naming a path), ``missing`` (open a file that does not exist),
            ``value`` (a plain ValueError: an error of this code, which keeps its traceback).
        path: The file ``missing`` opens.
    """

    def __init__(self, failure: str = "network", path: str = "/no/such/folder/set.bin", **kwargs) -> None:
        super().__init__(**kwargs)
        self.failure, self.path = failure, path

    def prepare_data(self) -> None:
        if self.failure == "network":
            urllib.request.urlopen(UNREACHABLE_URL, timeout=10)
        elif self.failure == "disk_full":
            with open("/dev/full", "wb") as handle:  # every write fails with ENOSPC, as on a full disk
                handle.write(b"x" * 2**20)
        elif self.failure == "permission":
            raise PermissionError(errno.EACCES, "Permission denied", "/srv/shared/dataset.tar.gz")
        elif self.failure == "missing":
            open(self.path, "rb").close()
        elif self.failure == "value":
            raise ValueError("threshold must be positive")


class DownloadingModel(TinyClassifier):
    """Test-only: a model whose constructor downloads pretrained weights, from a host that does not resolve."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        urllib.request.urlopen(UNREACHABLE_URL, timeout=10)


def run_in_process(capsys, args: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(args)
    return stop.value.code, capsys.readouterr().err


def fails_with(capsys, args: list[str], *needles: str) -> str:
    """Run the CLI in-process; expect exit status 1 and one paragraph with every needle and no blamed option."""
    code, err = run_in_process(capsys, args)
    assert code == 1, err
    assert "Traceback" not in err, err
    message = err[err.index("error: ") :]
    assert len(message.strip().splitlines()) == 1, message
    assert "Fix: " in message and "correct those" not in message, message
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message}"
    return message


def data_args(tmp_path: Path, failure: str, *extra: str) -> list[str]:
    return [
        "fit",
        *TINY,
        "--data=tests.test_quiet.FailingData",
        f"--data.init_args.failure={failure}",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        *extra,
    ]


def test_a_failed_download_in_prepare_data_is_no_network(tmp_path, capsys):
    # urllib's URLError does not keep the address; a data module that names it passes it (tests/examples)
    message = fails_with(capsys, data_args(tmp_path, "network"), "no network: cannot reach the server", "URLError")
    assert "This is not a wrong option" in message
    assert not list((tmp_path / "run").rglob("*.ckpt"))


def test_a_full_disk_is_disk_full(tmp_path, capsys):
    fails_with(capsys, data_args(tmp_path, "disk_full"), "disk full", "No space left on device", "df -h")


def test_permission_denied_names_the_path(tmp_path, capsys):
    fails_with(capsys, data_args(tmp_path, "permission"), "permission denied", "/srv/shared/dataset.tar.gz")


def test_a_missing_file_names_the_path(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "set.bin"
    fails_with(
        capsys, data_args(tmp_path, "missing", f"--data.init_args.path={missing}"), "file not found", str(missing)
    )


def test_a_constructor_that_downloads_is_no_network_not_a_bad_option(tmp_path, capsys):
    args = [
        "fit",
        *TINY,
        "--model=tests.test_quiet.DownloadingModel",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    message = fails_with(capsys, args, "no network", "URLError")
    assert "building" not in message


def test_other_errors_of_a_hook_keep_their_traceback(tmp_path):
    with pytest.raises(ValueError, match="threshold must be positive"):
        main(data_args(tmp_path, "value"))
    assert not list((tmp_path / "run").rglob("*.ckpt"))


def test_the_debug_switch_shows_the_network_errors_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "true")
    with pytest.raises(OSError, match="urlopen error"):  # URLError, raised as it was
        main(data_args(tmp_path, "network"))


@pytest.mark.slow
def test_ddp_reports_a_failed_download_once_with_exit_status_1(tmp_path):
    args = data_args(tmp_path, "network", "--trainer.strategy=ddp", "--trainer.devices=2")
    result = prewarmed.run(
        [sys.executable, "-m", "tests.cli", *args], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("error: ") == 1, result.stderr
    assert "no network: cannot reach the server" in result.stderr and "Traceback" not in result.stderr


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
    of them fails, Lightning or PyTorch dropped that line: delete its filter in multigpu/quiet.py)."""
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


class FullDisk(io.FileIO):
    """A file on a disk that fills up after ``room`` bytes: later writes fail with ENOSPC, as a real disk's do."""

    room = 4096

    def write(self, data) -> int:
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_a_checkpoint_save_on_a_full_disk_is_disk_full_with_the_checkpoints_path(tmp_path, monkeypatch):
    """torch's zip writer turns the file's ENOSPC into ``RuntimeError: unexpected pos``; the save says disk full."""
    monkeypatch.setattr(files.os, "fdopen", lambda handle, mode: FullDisk(handle, mode.replace("b", "")))
    path = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(OSError) as raised:
        files.atomic_torch_save({"weights": torch.zeros(10_000)}, path)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert isinstance(raised.value.__cause__, RuntimeError)  # what torch raised
    assert list(path.parent.iterdir()) == []  # no temporary file left
    failure = user_error_of(raised.value)
    assert str(failure).startswith(f"disk full: writing {path} failed (No space left on device)"), failure


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
