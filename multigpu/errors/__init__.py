"""The errors a user can fix, each told in one paragraph, and the stops on purpose (printed by ``reporting.py``)."""

from __future__ import annotations

import os
import sys

from lightning.fabric.utilities.rank_zero import rank_zero_only

#: jsonargparse's own debug switch; it turns every one-paragraph error back into a traceback
DEBUG_ENV = "JSONARGPARSE_DEBUG"
MAX_DETAIL_CHARS = 400  # a state-dict mismatch or a pickle error can run to a hundred lines


@rank_zero_only
def notice(message: str) -> None:
    """A line for the person running the command (stderr, rank 0), not a Python warning with its source line."""
    print(f"note: {message}", file=sys.stderr, flush=True)


class ConfigurationError(ValueError):
    """A bad option, file or environment: the message names the option and the fix. ``every_rank``: every rank
    fails it alike, so rank 0 reports it whichever rank fails first."""

    def __init__(self, message: str, *, every_rank: bool = False) -> None:
        super().__init__(message)
        self.every_rank = every_rank


class EnvironmentFailure(ConfigurationError):
    """The network or the file system failed, not an option (exit status 1: the command itself was right)."""

    exit_code = 1


class TrainingStopped(Exception):
    """Training stopped on purpose, with a message saying why and what to do; ``exit_code`` is the exit status."""

    exit_code = 1
    label = "stopped"

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class Preempted(TrainingStopped):
    """Training stopped after saving a resumable checkpoint: 75 for a preemption notice, else ``128 + signal``."""

    exit_code = 75  # EX_TEMPFAIL, "retry later", which the slurm/ scripts requeue
    label = "preempted"


def debug_mode() -> bool:
    return os.environ.get(DEBUG_ENV, "").lower() in ("true", "1", "yes")


def one_paragraph(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def describe(exception: BaseException) -> str:
    return one_paragraph(f"{type(exception).__name__}: {exception}")


def causes(exception: BaseException) -> list[BaseException]:
    """The exception and the ones it was raised from; not its implicit context, or code that catches a missing
    cache file and then fails otherwise would be reported as a missing file."""
    chain: list[BaseException] = []
    while exception is not None and exception not in chain:
        chain.append(exception)
        exception = exception.__cause__
    return chain
