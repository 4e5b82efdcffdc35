"""What failed, told from the exception alone: the network or the file system (an ``EnvironmentFailure`` naming the
URL or the path), a collective that timed out or lost a peer, or a configuration error raised from deeper down."""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import socket
import ssl
import urllib.error
from pathlib import Path
from urllib.parse import urlparse

from torch.multiprocessing.spawn import ProcessRaisedException

from multigpu.errors import DEBUG_ENV, ConfigurationError, EnvironmentFailure, causes, describe

NETWORK_ERRORS = (urllib.error.URLError, ConnectionError, TimeoutError, socket.herror, http.client.HTTPException)
#: packages whose every exception is a failed request (told by module: none is a dependency)
NETWORK_PACKAGES = ("requests", "urllib3", "httpx", "aiohttp")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)
FILE_SYSTEM_ERRNOS = (*DISK_FULL, *NO_PERMISSION, errno.ENOENT)
NO_NETWORK_ERRNOS = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ECONNREFUSED, errno.ENETDOWN)


def is_network_error(exception: BaseException) -> bool:
    """True for an exception of the network, by its type."""
    if isinstance(exception, (*NETWORK_ERRORS, socket.gaierror, ssl.SSLError)):
        return True
    return type(exception).__module__.split(".")[0] in NETWORK_PACKAGES


def network_failure(exception: BaseException, url: str | None = None, fix: str | None = None) -> EnvironmentFailure:
    """The one-paragraph error for no network or a failed download, naming the URL where known."""
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
    """The configuration, network or file-system error this exception is or was raised from, by type; else None."""
    for error in causes(exception):
        if isinstance(error, ConfigurationError):
            return error
        if is_network_error(error):
            return network_failure(error)
        if isinstance(error, OSError) and error.errno in FILE_SYSTEM_ERRNOS:
            return file_system_failure(error)
    return None


COLLECTIVE_FAILURE_TEXTS = (
    "Timed out",
    "timed out",
    "timeout",  # NCCL's watchdog: "Watchdog caught collective operation timeout"
    "Connection closed by peer",
    "Connection reset",
    "Broken pipe",
)
COLLECTIVE_BACKENDS = ("gloo", "NCCL", "c10d", "ProcessGroup")


def collective_failure(exception: BaseException) -> bool:
    """True for a collective that timed out or lost a peer, told by its text: such errors have no type of their own."""
    if getattr(exception, "collective_report", None) or spawned_collective_failure(exception):
        return True
    for error in causes(exception):
        distributed = type(error).__name__ in ("DistBackendError", "DistNetworkError")
        # a plain RuntimeError only where it comes from a backend (gloo prefixes its source file), not a user's
        backend = type(error) is RuntimeError and any(name in str(error) for name in COLLECTIVE_BACKENDS)
        if (distributed or backend) and any(text in str(error) for text in COLLECTIVE_FAILURE_TEXTS):
            return True
    return False


def attach_collective_report(exception: BaseException, report: str, rank_zero_reports: bool = False) -> None:
    """Give a failed collective's exception the report printed instead of its traceback; ``rank_zero_reports``:
    rank 0's own report will cover it."""
    with contextlib.suppress(AttributeError):
        exception.collective_report = report  # type: ignore[attr-defined]
        exception.rank_zero_reports = rank_zero_reports  # type: ignore[attr-defined]


def spawned_collective_failure(exception: BaseException) -> bool:
    """True for a ``ddp_spawn`` worker's failed collective, which arrives as its traceback's text."""
    if not isinstance(exception, ProcessRaisedException):
        return False
    lines = str(exception).strip().splitlines()
    last = lines[-1] if lines else ""
    return any(name in last for name in COLLECTIVE_BACKENDS) and any(text in last for text in COLLECTIVE_FAILURE_TEXTS)


def collective_failure_message(exception: BaseException) -> str:
    """The paragraph for a failed collective: the report of every rank's place where one was made."""
    report = getattr(exception, "collective_report", None)
    if report:
        return report
    return (
        f"a collective of several processes timed out or lost its connection ({describe(exception)}): another rank"
        " did not arrive in time, or is gone. Fix: the engine's docs/troubleshooting.md, \"My multi-GPU job hangs or"
        ' is slow";'
        " `python -m multigpu.stacks RUN_DIR` shows where each live rank is."
    )
