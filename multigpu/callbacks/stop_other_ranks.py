"""Stop the other ranks when the first process fails, so that they do not wait in their next collective until it
times out; after a stop every rank agreed on, wait for them to finish instead."""

from __future__ import annotations

import atexit

import lightning as L

from multigpu.compat import release_started_processes
from multigpu.errors import TrainingStopped
from multigpu.processes import wait_for_exit

#: how long the first process waits at exit for the ranks it started to finish an agreed stop
STOPPED_RANKS_GRACE_S = 60.0


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
