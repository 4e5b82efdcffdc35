"""What failed, told from the exception alone (multigpu/errors/failures.py): a user error wherever it was raised, the
network and the file system by type, a collective that timed out or lost its connection by its text. How each is
printed: tests/errors/test_reporting.py and, through the command line, this file's second half and
tests/errors/test_errors.py."""

from __future__ import annotations

import errno
import io
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.spawn import ProcessRaisedException

from multigpu.checkpoints import files
from multigpu.errors import DEBUG_ENV, ConfigurationError, EnvironmentFailure
from multigpu.errors.failures import collective_failure, file_system_failure, spawned_collective_failure, user_error_of
from tests import prewarmed
from tests.cli import main
from tests.conftest import REPO, TINY, cli_env
from tests.fixtures.workload import TinyClassifier, TinyData

GLOO_TIMEOUT = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv"
GLOO_CLOSED = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5125"


def test_user_errors_are_told_by_their_type_wherever_they_were_raised():
    wrapped = ValueError("as jsonargparse wraps a constructor's error")
    wrapped.__cause__ = ConfigurationError("--data.x=1 is wrong. Fix: y.")
    assert str(user_error_of(wrapped)) == "--data.x=1 is wrong. Fix: y."
    network = user_error_of(urllib.error.URLError(OSError(errno.ENETUNREACH, "Network is unreachable")))
    assert isinstance(network, EnvironmentFailure) and str(network).startswith("no network: cannot reach the server")
    disk = user_error_of(OSError(errno.ENOSPC, "No space left on device", "/runs/a/last.ckpt"))
    assert isinstance(disk, EnvironmentFailure) and str(disk).startswith("disk full: writing /runs/a/last.ckpt")
    # an error of the code, or of another rank lost (gloo says so in a RuntimeError), is none of these
    assert user_error_of(KeyError("batch")) is None
    assert user_error_of(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")) is None


def test_a_file_system_failure_names_the_path_and_the_fix():
    denied = file_system_failure(PermissionError(errno.EACCES, "Permission denied", "/data/train.bin"))
    assert str(denied).startswith("permission denied: /data/train.bin") and "`ls -ld /data`" in str(denied)
    assert denied.exit_code == 1  # the command itself was right
    quota = file_system_failure(OSError(errno.EDQUOT, "Disk quota exceeded"), path="/runs/a/last.ckpt")
    assert str(quota).startswith("disk quota exceeded: writing /runs/a/last.ckpt") and "quota -s" in str(quota)


def test_a_failed_collective_is_told_by_its_text():
    assert collective_failure(RuntimeError(GLOO_TIMEOUT)) and collective_failure(RuntimeError(GLOO_CLOSED))
    assert collective_failure(torch.distributed.DistBackendError("Watchdog caught collective operation timeout"))
    assert not collective_failure(RuntimeError("my request timed out"))  # a user's own error keeps its traceback
    wrapped = ValueError("step failed")
    wrapped.__cause__ = RuntimeError(GLOO_CLOSED)
    assert collective_failure(wrapped)
    # a ddp_spawn worker's failure reaches the launching process as the text of its traceback
    spawned = ProcessRaisedException(f"Traceback (most recent call last):\n  ...\nRuntimeError: {GLOO_CLOSED}", 1, 4242)
    assert spawned_collective_failure(spawned) and collective_failure(spawned)
    assert not spawned_collective_failure(ProcessRaisedException("Traceback ...\nKeyError: 'batch'", 1, 4242))


# -- through the command line: a failure of the user's code said by its type, with exit status 1 --------------

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
        "--data=tests.errors.test_failures.FailingData",
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
        "--model=tests.errors.test_failures.DownloadingModel",
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
