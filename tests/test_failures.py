"""What failed, told from the exception alone (multigpu/failures.py): a user error wherever it was raised, the
network and the file system by type, a collective that timed out or lost its connection by its text. How each is
printed: tests/test_reporting.py and, through the command line, tests/test_errors.py."""

from __future__ import annotations

import errno
import urllib.error

import torch
from torch.multiprocessing.spawn import ProcessRaisedException

from multigpu.errors import ConfigurationError, EnvironmentFailure
from multigpu.failures import collective_failure, file_system_failure, spawned_collective_failure, user_error_of

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
