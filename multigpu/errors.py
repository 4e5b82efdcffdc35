"""Errors a user can fix, and how the command line reports them: one paragraph and a non-zero exit status.

Bad input is a ``ConfigurationError`` naming the option and the fix (exit status 2); a failure of the network or
the file system, told by the exception's type, an ``EnvironmentFailure`` (exit status 1); a collective of several
processes that timed out or lost its connection, the report of where every rank was
(``multigpu/callbacks/stacks.py``; exit status ``COLLECTIVE_FAILURE_EXIT_CODE``, 70); any other exception keeps its
traceback, as every error does under ``JSONARGPARSE_DEBUG=true``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import http.client
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from urllib.parse import urlparse

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

from multigpu.compat import release_started_processes

#: the debug switch jsonargparse already reads; it turns every one-paragraph error back into a traceback
DEBUG_ENV = "JSONARGPARSE_DEBUG"
MAX_DETAIL_CHARS = 400  # a state-dict mismatch or a pickle error can run to a hundred lines
#: how long a rank other than 0 waits before it reports: rank 0 usually meets the same error and stops it first
#: (``StopOtherRanksOnError``), reporting alone
REPORT_GRACE_SECONDS = 2.0
#: how long the first process waits at exit for the ranks it started to finish an agreed stop
STOPPED_RANKS_GRACE_S = 60.0
#: the exit status of a rank whose collective timed out or lost its connection (EX_SOFTWARE): not a bad option (2)
#: nor a failure of the machine (1), and not requeued
COLLECTIVE_FAILURE_EXIT_CODE = 70
#: what gloo, NCCL and torch.distributed say when a collective waits too long or a peer is gone
COLLECTIVE_FAILURE_TEXTS = (
    "Timed out",
    "timed out",
    "timeout",  # NCCL's watchdog: "Watchdog caught collective operation timeout"
    "Connection closed by peer",
    "Connection reset",
    "Broken pipe",
)
COLLECTIVE_BACKENDS = ("gloo", "NCCL", "c10d", "ProcessGroup")


@rank_zero_only
def notice(message: str) -> None:
    """A line for the person running the command (stderr, rank 0): not a Python warning with its source line."""
    print(f"note: {message}", file=sys.stderr, flush=True)


class ConfigurationError(ValueError):
    """A bad option, file or environment: the message names the option and the fix."""


class EnvironmentFailure(ConfigurationError):
    """The network or the file system failed, not an option (reported the same way; exit status 1: the command
    itself was right)."""

    exit_code = 1


class TrainingStopped(Exception):
    """Training stopped on purpose, with a message saying why and what to do; ``exit_code`` is the exit status."""

    exit_code = 1
    label = "stopped"  # how the CLI introduces the message

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class Preempted(TrainingStopped):
    """Training stopped early after saving a resumable checkpoint (a signal asked it to stop); ``128 + signal``
    for a stop a person or a scheduler asked for (130 for Ctrl-C, 143 for SIGTERM), which is not requeued."""

    exit_code = 75  # a preemption notice: EX_TEMPFAIL, "retry later", which the slurm/ scripts requeue
    label = "preempted"


def debug_mode() -> bool:
    """True when the user asked for tracebacks (``JSONARGPARSE_DEBUG=true``)."""
    return os.environ.get(DEBUG_ENV, "").lower() in ("true", "1", "yes")


def one_paragraph(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def describe(exception: BaseException) -> str:
    """``TypeName: message`` on one line, short enough for a paragraph."""
    return one_paragraph(f"{type(exception).__name__}: {exception}")


def causes(exception: BaseException) -> list[BaseException]:
    """The exception and the ones it was raised from (``raise ... from``), not its implicit context: code that
    catches a missing cache file and then fails otherwise must not be reported as a missing file."""
    chain: list[BaseException] = []
    while exception is not None and exception not in chain:
        chain.append(exception)
        exception = exception.__cause__
    return chain


# -- network and file-system failures, by the type of the exception -------------------------------------------

#: the network's exceptions: urllib's, the socket's, and the HTTP client's (a server that hung up mid-download)
NETWORK_ERRORS = (urllib.error.URLError, ConnectionError, TimeoutError, socket.herror, http.client.HTTPException)
#: packages whose every exception is a failed request (checked by module: none of them is a dependency)
NETWORK_PACKAGES = ("requests", "urllib3", "httpx", "aiohttp")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)
FILE_SYSTEM_ERRNOS = (*DISK_FULL, *NO_PERMISSION, errno.ENOENT)
NO_NETWORK_ERRNOS = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ECONNREFUSED, errno.ENETDOWN)


def is_network_error(exception: BaseException) -> bool:
    """True for an exception of the network (urllib, sockets, HTTP clients), by its type."""
    if isinstance(exception, (*NETWORK_ERRORS, socket.gaierror, ssl.SSLError)):
        return True
    return type(exception).__module__.split(".")[0] in NETWORK_PACKAGES


def network_failure(exception: BaseException, url: str | None = None, fix: str | None = None) -> EnvironmentFailure:
    """The one-paragraph error for no network or a failed download, naming the URL where one is known."""
    if url is None:  # HTTPError keeps its URL, and requests' and httpx's errors their request's
        chain = causes(exception)
        found = [getattr(e, "url", None) or getattr(getattr(e, "request", None), "url", None) for e in chain]
        url = next((u for u in found if isinstance(u, str) and u), None)
    host = (urlparse(url).hostname or url) if url else None
    where = f"{host} ({url})" if url and host != url else (url or "the server")
    reasons = [error.reason if isinstance(error, urllib.error.URLError) else error for error in causes(exception)]
    if any(
        isinstance(reason, socket.gaierror) or (isinstance(reason, OSError) and reason.errno in NO_NETWORK_ERRNOS)
        for reason in reasons
    ):
        what = f"no network: cannot reach {where}"
        default_fix = (
            f"run where {host or 'the server'} can be reached (on a cluster, compute nodes often have no network"
            " while login nodes do; set https_proxy if a proxy is needed), or fetch the files there first"
        )
    else:
        what = f"download failed: {where}"
        default_fix = "run again later; if it repeats, check the address and the network (and https_proxy)"
    return EnvironmentFailure(
        f"{what} ({describe(exception)}). This is not a wrong option. Fix: {fix or default_fix}; set {DEBUG_ENV}=true"
        " to see the traceback."
    )


def file_system_failure(
    exception: OSError, path: str | os.PathLike | None = None, fix: str | None = None
) -> EnvironmentFailure:
    """The one-paragraph error for permission denied, disk full or file not found, naming the path when known."""
    path = path or exception.filename
    shown = str(path) if path else "a file (the failing call did not name it)"
    folder = Path(path).parent if path else None
    if exception.errno in DISK_FULL:
        quota = exception.errno == errno.EDQUOT
        what = f"{'disk quota exceeded' if quota else 'disk full'}: writing {shown} failed ({exception.strerror})"
        default_fix = (
            f"free space on that file system (`df -h {folder or '.'}`{', `quota -s`' if quota else ''}), or write"
            " elsewhere (--trainer.default_root_dir for the run, the data module's folder option for data)"
        )
    elif exception.errno in NO_PERMISSION:
        what = f"permission denied: {shown} ({exception.strerror})"
        default_fix = f"make it accessible to this user (`ls -ld {folder or shown}`), or use a folder you can write to"
    else:
        what = f"file not found: {shown}"
        default_fix = "check the path (and the option that gives it), or create the file"
    return EnvironmentFailure(f"{what}. Fix: {fix or default_fix}; set {DEBUG_ENV}=true to see the traceback.")


def user_error_of(exception: BaseException) -> ConfigurationError | None:
    """The configuration, network or file-system error this exception is (or was raised from), by type alone; or
    None (an error of the code that raised it)."""
    for error in causes(exception):
        if isinstance(error, ConfigurationError):
            return error
        if is_network_error(error):
            return network_failure(error)
        if isinstance(error, OSError) and error.errno in FILE_SYSTEM_ERRNOS:
            return file_system_failure(error)
    return None


def collective_failure(exception: BaseException) -> bool:
    """True for a collective of torch.distributed that timed out or lost its connection to another rank: a
    ``DistBackendError`` or gloo's ``RuntimeError``, told by its text (they have no type of their own)."""
    if getattr(exception, "collective_report", None) or spawned_collective_failure(exception):
        return True
    for error in causes(exception):
        distributed = type(error).__name__ in ("DistBackendError", "DistNetworkError")
        # a plain RuntimeError only where it comes from a backend (gloo prefixes its source file), not a user's
        backend = type(error) is RuntimeError and any(name in str(error) for name in COLLECTIVE_BACKENDS)
        if (distributed or backend) and any(text in str(error) for text in COLLECTIVE_FAILURE_TEXTS):
            return True
    return False


def attach_collective_report(exception: BaseException, report: str) -> None:
    """Give a failed collective's exception the report that ``report`` prints instead of its traceback."""
    with contextlib.suppress(AttributeError):
        exception.collective_report = report  # type: ignore[attr-defined]


def spawned_collective_failure(exception: BaseException) -> bool:
    """True for a ``ddp_spawn`` worker's failed collective, which reaches the launching process as the text of the
    worker's traceback: its last line is the collective's error."""
    if not isinstance(exception, ProcessRaisedException):
        return False
    lines = str(exception).strip().splitlines()
    last = lines[-1] if lines else ""
    return any(name in last for name in COLLECTIVE_BACKENDS) and any(text in last for text in COLLECTIVE_FAILURE_TEXTS)


def collective_failure_message(exception: BaseException) -> str:
    """The paragraph for a failed collective: the report of every rank's place where one was made, else what
    is known without it."""
    report = getattr(exception, "collective_report", None)
    if report:
        return report
    return (
        f"a collective of several processes timed out or lost its connection ({describe(exception)}): another rank"
        " did not arrive in time, or is gone. Fix: the engine's docs/troubleshooting.md, \"My multi-GPU job hangs or"
        ' is slow";'
        " `python -m multigpu.stacks RUN_DIR` shows where each live rank is."
    )


# -- reporting -----------------------------------------------------------------------------------------------


def report(exception: BaseException) -> int:
    """Print a user error as one paragraph and return the exit status; re-raise anything else."""
    if debug_mode():
        raise exception
    error = user_error_of(exception)
    if error is not None:
        rank = getattr(rank_zero_only, "rank", 0)
        if rank:
            time.sleep(REPORT_GRACE_SECONDS)
        print(f"error: {f'(rank {rank}) ' if rank else ''}{error}", file=sys.stderr)
        return getattr(error, "exit_code", 2)
    if collective_failure(exception):  # the report of where every rank is, not the survivor's 150-line traceback
        rank = getattr(rank_zero_only, "rank", 0)
        print(f"error: {f'(rank {rank}) ' if rank else ''}{collective_failure_message(exception)}", file=sys.stderr)
        return COLLECTIVE_FAILURE_EXIT_CODE
    if isinstance(exception, ProcessExitedException):  # a ddp_spawn worker was killed: one line, no traceback
        print(f"stopped: {one_paragraph(str(exception))}", file=sys.stderr)
        return 1
    if isinstance(exception, ProcessRaisedException):
        # the worker's own traceback, as torch hands it over; the parent's adds only torch.multiprocessing's frames
        print(str(exception).strip(), file=sys.stderr)
        return 1
    origin = getattr(exception, "multigpu_origin", None)
    if origin is not None:  # an error of the user's own code keeps its traceback, headed by where it came from
        print(f"error in {origin}; its traceback follows.", file=sys.stderr, flush=True)
    raise exception


class StopOtherRanksOnError(L.Callback):
    """When the first process fails, stop the ranks it started before it reports, or they would wait in their next
    collective until the timeout. SIGKILL, as Lightning uses on Ctrl-C: a rank inside a collective ignores SIGTERM.
    """

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if trainer.world_size == 1:  # one process has no other ranks to stop
            return
        if isinstance(exception, TrainingStopped):
            # every rank agreed to stop at this step and exits with the same status after saving: let them finish
            # (their shards and logs), and exit after them, so the job's status is this one's
            atexit.register(wait_for_exit, release_started_processes(trainer), STOPPED_RANKS_GRACE_S)
            return
        # out of Lightning's watch first: its observer thread SIGKILLs this process when one of them exits on the
        # signal, which can come before this process reports and exits with its own status
        for process in release_started_processes(trainer):
            process.kill()


def wait_for_exit(processes: list[subprocess.Popen], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` in all for ``processes`` to exit; kill the ones still running then."""
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
