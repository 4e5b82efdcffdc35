"""How the command line reports an exception: one paragraph and a non-zero exit status.

Bad input is a ``ConfigurationError`` naming the option and the fix (exit status 2); a failure of the network or
the file system, told by the exception's type, an ``EnvironmentFailure`` (exit status 1); a collective of several
processes that timed out or lost its connection, the report of where every rank was
(``multigpu/callbacks/stack_dumps.py``; exit status ``COLLECTIVE_FAILURE_EXIT_CODE``, 70); any other exception keeps
its traceback, as every error does under ``JSONARGPARSE_DEBUG=true``.
"""

from __future__ import annotations

import sys
import time

from lightning.fabric.utilities.rank_zero import rank_zero_only
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

from multigpu.errors import debug_mode, one_paragraph
from multigpu.failures import collective_failure, collective_failure_message, user_error_of

#: how long a rank other than 0 waits before it reports a user error or a failed collective: rank 0 usually meets
#: the same error and stops it first (``StopOtherRanksOnError``), reporting alone
REPORT_GRACE_SECONDS = 2.0
#: the exit status of a rank whose collective timed out or lost its connection (EX_SOFTWARE): not a bad option (2)
#: nor a failure of the machine (1), and not requeued
COLLECTIVE_FAILURE_EXIT_CODE = 70


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
        if rank:
            time.sleep(REPORT_GRACE_SECONDS)  # a desync fails on rank 0 too: its report and exit status come first
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
