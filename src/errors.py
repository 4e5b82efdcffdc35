"""Errors the user can fix by changing an option; the CLI prints them as one paragraph, without a traceback.

An exception is a configuration error when the user's own code did not cause it: raised while building the
model, data module, trainer or loggers from the config, or inside the hooks that only act on configured values
(``prepare_data``, ``setup``, ``configure_optimizers``, ``configure_model``). Exceptions from ``training_step``
and the other hooks of the user's training code keep their traceback. ``JSONARGPARSE_DEBUG=true`` shows the
traceback of every error.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import traceback
from types import TracebackType

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

#: the debug switch jsonargparse already reads; it turns every one-paragraph error back into a traceback
DEBUG_ENV = "JSONARGPARSE_DEBUG"
#: hooks of a LightningModule / LightningDataModule that only act on values from the config
CONFIG_HOOKS = ("prepare_data", "setup", "configure_optimizers", "configure_model")
MAX_DETAIL_CHARS = 400  # a state-dict mismatch or a pickle error can run to a hundred lines


class ConfigurationError(ValueError):
    """A bad option, file or environment: the message names the option and the fix."""


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
    for frame, _ in traceback.walk_tb(exception.__traceback__):  # the outermost constructor is the configured one
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        option = _option_of(owner)
        if option is not None:
            name = type(owner).__name__
            return ConfigurationError(
                f"building {name} from the values given to {option} failed: {describe(exception)}."
                f" Fix: correct those options (`python -m src.cli fit --help` lists them, `--model.help CLASS` and"
                f" `--data.help CLASS` a class's); set {DEBUG_ENV}=true to see the traceback."
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
        f" Fix: correct those {option}.init_args.* options (`python -m src.cli fit {option}.help CLASS` lists"
        f" them); set {DEBUG_ENV}=true to see the traceback."
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
    hooks = _SPAWNED_HOOK.findall(text)
    if not hooks:
        return None
    detail = one_paragraph(f"{last.group('type').rsplit('.', 1)[-1]}: {message}")
    return ConfigurationError(
        f"the {hooks[0]} hook failed with the values given to --model or --data: {detail}."
        f" Fix: correct those options; set {DEBUG_ENV}=true to see the traceback."
    )


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
    return isinstance(exception, RuntimeError) and _LOST_PEER.search(str(exception)) is not None


def configuration_error_of(exception: BaseException) -> ConfigurationError | None:
    """The configuration error this exception is, or None for an error of the training code."""
    if isinstance(exception, ConfigurationError):
        return exception
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
    error = configuration_error_of(exception)
    if error is not None:
        if started_by_launcher():
            # the first process usually hits the same error a moment later and stops this one before it prints
            deadline = time.monotonic() + REPORT_GRACE_SECONDS
            while time.monotonic() < deadline and _main_process_alive():
                time.sleep(0.1)
            if not _main_process_alive():
                return 2
            print(f"error: (rank {_rank()}) {error}", file=sys.stderr)
        else:
            print(f"error: {error}", file=sys.stderr)
        return 2
    if lost_peer(exception):
        print(
            f"stopped: rank {_rank()} lost contact with another process of this run, which failed or was killed"
            " (its own error, if it could print one, is above).",
            file=sys.stderr,
        )
        return 1
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
