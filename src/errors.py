"""Errors the user can fix by changing an option, or the machine; the CLI prints them as one paragraph.

A network or file-system failure is called what it is, by the type of the exception wherever it was raised: no
network or a failed download (with the host), permission denied, disk full or file not found (with the path).
Its fix is on the machine, not in an option, so it exits with status 1 (``EnvironmentFailure``).

Any other exception is a configuration error (exit status 2) when the user's own code did not cause it: raised
while building the model, data module, trainer or loggers from the config, or inside the hooks that only act on
configured values (``prepare_data``, ``setup``, ``configure_optimizers``, ``configure_model``). Exceptions from
``training_step`` and the other hooks of the user's training code keep their traceback.
``JSONARGPARSE_DEBUG=true`` shows the traceback of every error.
"""

from __future__ import annotations

import errno
import http.client
import os
import re
import signal
import socket
import ssl
import sys
import time
import traceback
import urllib.error
from pathlib import Path
from types import TracebackType
from urllib.parse import urlparse

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException


@rank_zero_only
def notice(message: str) -> None:
    """A line for the person running the command (stderr, rank 0): not a Python warning with its source line."""
    print(f"note: {message}", file=sys.stderr, flush=True)


#: the debug switch jsonargparse already reads; it turns every one-paragraph error back into a traceback
DEBUG_ENV = "JSONARGPARSE_DEBUG"
#: hooks of a LightningModule / LightningDataModule that only act on values from the config
CONFIG_HOOKS = ("prepare_data", "setup", "configure_optimizers", "configure_model")
MAX_DETAIL_CHARS = 400  # a state-dict mismatch or a pickle error can run to a hundred lines


class ConfigurationError(ValueError):
    """A bad option, file or environment: the message names the option and the fix."""


class EnvironmentFailure(ConfigurationError):
    """The network or the file system failed, not an option: the message names the host or the path.

    A subclass of ``ConfigurationError`` so that it travels the same way (one paragraph, printed once in a
    multi-process run); ``exit_code`` 1 tells a script that the command itself was right.
    """

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
    """Training stopped early after saving a resumable checkpoint (a signal asked it to stop).

    ``exit_code`` is the process's exit status: 75 (EX_TEMPFAIL, "retry later") for a preemption notice such as
    SLURM's ``SIGUSR1``, which the ``slurm/`` scripts requeue; ``128 + signal`` for a stop a person or a
    scheduler asked for (130 for Ctrl-C, 143 for SIGTERM), which is not requeued but resumes all the same.
    """

    exit_code = 75  # the default: EX_TEMPFAIL, "temporary failure; the user is invited to retry"
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


def _option_of(owner: object) -> str | None:
    """The option that configures an object of this kind (None: not an object the config builds)."""
    kinds = (
        (L.LightningDataModule, "--data"),
        (L.LightningModule, "--model"),
        (L.Trainer, "--trainer"),
        (Logger, "--trainer.logger"),
        (L.Callback, "--trainer.callbacks (or --checkpoint.*, --preemption.*)"),
        (torch.optim.Optimizer, "--model.init_args.optimizer"),
        (torch.optim.lr_scheduler.LRScheduler, "--model.init_args.lr_scheduler"),
    )
    return next((option for kind, option in kinds if isinstance(owner, kind)), None)


def building_error(exception: BaseException) -> ConfigurationError:
    """The one-paragraph error for an exception raised while the CLI built an object from the config."""
    while exception.__cause__ is not None and not isinstance(exception, ConfigurationError):
        exception = exception.__cause__  # jsonargparse wraps a constructor's error in its own
    if isinstance(exception, ConfigurationError):
        return exception
    failure = environment_failure_of(exception)
    if failure is not None:  # a constructor that downloads or opens a file: the fix is not in its options
        return failure
    for frame, _ in traceback.walk_tb(exception.__traceback__):  # the outermost constructor is the configured one
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        option = _option_of(owner)
        if option is not None:
            name = type(owner).__name__
            return ConfigurationError(
                f"building {name} from the values given to {option} failed: {describe(exception)}."
                f" Fix: check those options (`python -m src.cli fit --help` lists them, `--model.help CLASS` and"
                f" `--data.help CLASS` a class's); set {DEBUG_ENV}=true to see the traceback and where it failed."
            )
    return ConfigurationError(
        f"building the objects from the config failed: {describe(exception)}. Fix: check the options this names;"
        f" set {DEBUG_ENV}=true to see the traceback."
    )


def config_hook_of(tb: TracebackType | None) -> tuple[str, str] | None:
    """``(option, "Class.hook")`` of the outermost configuration hook on the traceback, if any.

    Frames are told apart by where they run, not by the exception's type: a ``ValueError`` in ``setup`` is a
    bad value from the config, the same ``ValueError`` in ``training_step`` is a bug in the training code.
    """
    for frame, _ in traceback.walk_tb(tb):
        if frame.f_code.co_name not in CONFIG_HOOKS:
            continue
        owner = frame.f_locals.get("self")
        option = _option_of(owner)
        if option in ("--model", "--data"):
            return option, f"{type(owner).__name__}.{frame.f_code.co_name}"
    return None


def from_config_hook(exception: BaseException, option: str, where: str) -> ConfigurationError:
    """The one-paragraph error for an exception raised in a configuration hook of the model or data module."""
    if isinstance(exception, ConfigurationError):
        return exception
    return ConfigurationError(
        f"{where} failed with the values given to {option}: {describe(exception)}."
        f" Fix: check the {option}.init_args.* options it uses (`python -m src.cli fit {option}.help CLASS` lists"
        f" them); if they are right, the hook itself failed: set {DEBUG_ENV}=true to see the traceback."
    )


_SPAWNED_ERROR = re.compile(r"^(?P<type>[\w.]+(?:Error|Exception)): (?P<message>.*)", re.MULTILINE)
_SPAWNED_HOOK = re.compile(r'File "[^"]+", line \d+, in (' + "|".join(CONFIG_HOOKS) + r")\n")


def from_spawned_traceback(text: str) -> ConfigurationError | None:
    """The configuration error a ``ddp_spawn`` worker raised, read back from the traceback text it sent.

    ``torch.multiprocessing`` hands the parent only the text of a worker's traceback, so the frames can be read
    by name only: an exception whose traceback passes through a configuration hook is one.
    """
    errors = list(_SPAWNED_ERROR.finditer(text))
    if not errors:
        return None
    last = errors[-1]
    message = text[last.start("message") :].strip()
    if last.group("type").endswith("ConfigurationError"):
        return ConfigurationError(message)
    if last.group("type").endswith("EnvironmentFailure"):
        return EnvironmentFailure(message)
    failure = _spawned_environment_failure(last.group("type").rsplit(".", 1)[-1], message)
    if failure is not None:
        return failure
    hooks = _SPAWNED_HOOK.findall(text)
    if not hooks:
        return None
    detail = one_paragraph(f"{last.group('type').rsplit('.', 1)[-1]}: {message}")
    return ConfigurationError(
        f"the {hooks[0]} hook failed with the values given to --model or --data: {detail}."
        f" Fix: correct those options; set {DEBUG_ENV}=true to see the traceback."
    )


# -- network and file-system failures, by the type of the exception -------------------------------------------

#: the network's exceptions: urllib's, the socket's, and the HTTP client's (a server that hung up mid-download)
NETWORK_ERRORS = (urllib.error.URLError, ConnectionError, TimeoutError, socket.herror, http.client.HTTPException)
#: packages whose every exception is a failed request (checked by name: none of them is a dependency)
NETWORK_PACKAGES = ("requests", "urllib3", "httpx", "aiohttp")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)
FILE_SYSTEM_ERRNOS = (*DISK_FULL, *NO_PERMISSION, errno.ENOENT)
_NO_NETWORK_ERRNOS = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ECONNREFUSED, errno.ENETDOWN)
_URL = re.compile(r"https?://[^\s'\"<>)]+")
_HOST = re.compile(r"host=['\"]?([\w.-]+)")


def _causes(exception: BaseException) -> list[BaseException]:
    """The exception and the ones it was raised from (``raise ... from``; jsonargparse wraps that way).

    The implicit context (an exception raised while handling another) is not followed: code that catches a
    missing cache file and then fails for another reason must not be reported as a missing file.
    """
    chain: list[BaseException] = []
    while exception is not None and exception not in chain and len(chain) < 10:
        chain.append(exception)
        exception = exception.__cause__
    return chain


def is_network_error(exception: BaseException) -> bool:
    """True for an exception of the network (urllib, sockets, HTTP clients), by its type."""
    if isinstance(exception, (*NETWORK_ERRORS, socket.gaierror, ssl.SSLError)):
        return True
    return type(exception).__module__.split(".")[0] in NETWORK_PACKAGES


def _url_of(exception: BaseException) -> str | None:
    """The URL (or host) an exception names, from the attributes the HTTP libraries set or its message."""
    for error in _causes(exception):
        for candidate in (getattr(error, "url", None), getattr(getattr(error, "request", None), "url", None)):
            if isinstance(candidate, str) and candidate:
                return candidate
        for pattern in (_URL, _HOST):
            found = pattern.search(str(error))
            if found:
                return found.group(found.re.groups)
        # urllib's URLError does not keep the address; the request it was opening does
        for frame, _ in traceback.walk_tb(error.__traceback__):
            request = frame.f_locals.get("req") if frame.f_globals.get("__name__") == "urllib.request" else None
            if isinstance(getattr(request, "full_url", None), str):
                return request.full_url
    return None


def network_failure(exception: BaseException, url: str | None = None, fix: str | None = None) -> EnvironmentFailure:
    """The one-paragraph error for a failed network request: no network, a timeout, an HTTP error or a broken
    connection, naming the URL (or host) when known."""
    url = url or _url_of(exception)
    host = (urlparse(url).hostname or url) if url else None
    where = f"{host} ({url})" if url and host != url else (url or "the server")
    reasons = [error.reason if isinstance(error, urllib.error.URLError) else error for error in _causes(exception)]
    detail = describe(exception)
    if isinstance(exception, urllib.error.HTTPError):
        what = f"download failed: {url or 'the server'} answered HTTP {exception.code} {exception.reason}"
        default_fix = "check the address; if the server is down, run again later"
    elif any(isinstance(reason, TimeoutError) or "timed out" in str(reason) for reason in reasons):
        what = f"download failed: {where} did not answer in time ({detail})"
        default_fix = "run again later, or where the network is faster"
    elif any(
        isinstance(reason, socket.gaierror)
        or (isinstance(reason, OSError) and reason.errno in _NO_NETWORK_ERRNOS)
        or "Name or service not known" in str(reason)
        for reason in reasons
    ):
        what = f"no network: cannot reach {where} ({detail})"
        default_fix = (
            f"run where {host or 'the server'} can be reached (on a cluster, compute nodes often have no network"
            " while login nodes do; set https_proxy if a proxy is needed), or fetch the files there first"
        )
    else:
        what = f"download failed: the connection to {where} failed ({detail})"
        default_fix = "run again; if it repeats, check the network (and https_proxy)"
    return EnvironmentFailure(
        f"{what}. This is not a wrong option. Fix: {fix or default_fix}; set {DEBUG_ENV}=true to see the traceback."
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


def environment_failure_of(exception: BaseException) -> EnvironmentFailure | None:
    """The network or file-system failure this exception is (or was raised from), or None.

    Told apart by type: a ``URLError`` is no network wherever it was raised, and an ``OSError`` with
    ``ENOSPC`` is a full disk, not a bad option of whichever hook happened to write.
    """
    for error in _causes(exception):
        if isinstance(error, EnvironmentFailure):
            return error
        if is_network_error(error):
            return network_failure(error)
        if isinstance(error, OSError) and error.errno in FILE_SYSTEM_ERRNOS:
            return file_system_failure(error)
    return None


_SPAWNED_NETWORK = {"URLError", "HTTPError", "ConnectionError", "ConnectionRefusedError", "ConnectionResetError"}
_SPAWNED_NETWORK |= {"TimeoutError", "gaierror", "RemoteDisconnected", "IncompleteRead", "SSLError"}
_SPAWNED_ERRNO = re.compile(r"\[Errno (\d+)\] ([^:']+)(?:: '([^']*)')?")


def _spawned_environment_failure(type_name: str, message: str) -> EnvironmentFailure | None:
    """A network or file-system failure of a ``ddp_spawn`` worker, from the exception's name and message."""
    if type_name in _SPAWNED_NETWORK:
        return network_failure(ConnectionError(f"{type_name}: {one_paragraph(message)}"))
    found = _SPAWNED_ERRNO.search(message)
    if found and int(found.group(1)) in FILE_SYSTEM_ERRNOS:
        return file_system_failure(OSError(int(found.group(1)), found.group(2), found.group(3)))
    return None


# -- reporting once in a multi-process run -----------------------------------------------------------------------

#: set by the first process of a run; processes that Lightning's ddp launcher starts inherit it
MAIN_PID_ENV = "LIGHTNING_TEMPLATE_MAIN_PID"
#: how long a started rank waits for the first process to report the same error (and stop it) before reporting
REPORT_GRACE_SECONDS = 2.0
#: what a rank sees when another process of the run died: gloo's and NCCL's words for a lost peer
_LOST_PEER = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|NCCL communicator was aborted")


def _rank() -> int:
    return getattr(rank_zero_only, "rank", 0)


def started_by_launcher() -> bool:
    """True in a process that Lightning's ddp launcher started from the first one (rank 1 and up on a node)."""
    main_pid = os.environ.get(MAIN_PID_ENV)
    return "LOCAL_RANK" in os.environ and main_pid is not None and main_pid != str(os.getpid())


def _main_process_alive() -> bool:
    try:
        os.kill(int(os.environ[MAIN_PID_ENV]), 0)
    except (OSError, KeyError, ValueError):
        return False
    return True


def lost_peer(exception: BaseException) -> bool:
    """True for the error a rank gets in a collective when another process of the run exited or was killed."""
    if isinstance(exception, getattr(dist, "DistNetworkError", ())):
        return True
    return isinstance(exception, (RuntimeError, ConnectionError)) and _LOST_PEER.search(str(exception)) is not None


def configuration_error_of(exception: BaseException) -> ConfigurationError | None:
    """The configuration error this exception is, or None for an error of the training code."""
    if isinstance(exception, ConfigurationError):
        return exception
    failure = environment_failure_of(exception)
    if failure is not None:
        return failure
    hook = config_hook_of(exception.__traceback__)
    if hook is not None:
        return from_config_hook(exception, *hook)
    if isinstance(exception, ProcessRaisedException):
        return from_spawned_traceback(str(exception))
    return None


def report(exception: BaseException) -> int:
    """Print a user error as one paragraph and return the exit status; re-raise anything else.

    In a multi-process run the error is printed once: by the first process, which stops the others (see
    ``StopOtherRanksOnError``), or, when only a started rank found it, by that rank. A rank that stops only
    because another process died prints one line instead of a communication traceback.
    """
    if debug_mode():
        raise exception
    if lost_peer(exception):  # before the network failures: the connection lost is to another rank, not a server
        print(
            f"stopped: rank {_rank()} lost contact with another process of this run, which failed or was killed"
            " (its own error, if it could print one, is above).",
            file=sys.stderr,
        )
        return 1
    error = configuration_error_of(exception)
    if error is not None:
        exit_code = getattr(error, "exit_code", 2)
        if started_by_launcher():
            # the first process usually hits the same error a moment later and stops this one before it prints
            deadline = time.monotonic() + REPORT_GRACE_SECONDS
            while time.monotonic() < deadline and _main_process_alive():
                time.sleep(0.1)
            if not _main_process_alive():
                return exit_code
            print(f"error: (rank {_rank()}) {error}", file=sys.stderr)
        else:
            print(f"error: {error}", file=sys.stderr)
        return exit_code
    if isinstance(exception, ProcessExitedException):
        print(f"stopped: {one_paragraph(str(exception))}", file=sys.stderr)
        return 1
    if isinstance(exception, ProcessRaisedException):
        # the worker's own traceback; the parent's adds only torch.multiprocessing's frames
        print(str(exception).strip(), file=sys.stderr)
        return 1
    raise exception


class StopOtherRanksOnError(L.Callback):
    """Lightning callback: when the first process fails, it stops the ranks it started before it reports.

    Otherwise they would notice only at their next collective, and each add a communication traceback to the
    one error that matters. SIGKILL, as Lightning itself uses on Ctrl-C: a rank inside a collective ignores
    SIGTERM.
    """

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        launcher = trainer.strategy.launcher
        if isinstance(launcher, _SubprocessScriptLauncher) and not started_by_launcher():
            launcher.kill(signal.SIGKILL)
