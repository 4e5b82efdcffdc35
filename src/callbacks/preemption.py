"""Save and stop cleanly when the job is about to be preempted; requeue it on SLURM.

SLURM sends ``SIGUSR1`` some time before it kills a job (``#SBATCH --signal=SIGUSR1@90``). Lightning's own
handler saves a checkpoint *inside the signal handler*, wherever training happens to be: possibly in the middle
of an optimizer step, and under DDP while the other ranks sit in a collective, which can deadlock. Here the
handler only sets a flag. At an optimizer-step boundary all ranks agree on it (an asynchronous all-reduce, read
one step later, so training never waits for it), save ``last.ckpt`` together (after the validation that step
triggers, if any, so that no validation is skipped on resume), and stop; rank 0 then runs ``scontrol requeue``
(unless ``requeue=False``: the scripts in ``slurm/`` requeue from the batch script once every rank has exited,
so that nothing is cut short). The requeued job passes ``--ckpt_path=last`` and continues from exactly that
step: same data order, same weights.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from src.errors import Preempted

log = logging.getLogger(__name__)


def slurm_job_id() -> str | None:
    """The id ``scontrol requeue`` needs (``ARRAYJOB_TASK`` for array jobs)."""
    if "SLURM_ARRAY_JOB_ID" in os.environ and "SLURM_ARRAY_TASK_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


class AnyRankVote:
    """Whether any rank has raised a flag, agreed by every rank at the same step without stalling training.

    A blocking all-reduce on every step costs milliseconds with gloo and, with NCCL, a host-device sync (that
    is what ``strategy.reduce_boolean_decision`` does). Instead each step starts an asynchronous all-reduce on a
    CPU (gloo) group and reads the one started at the previous step, long finished by then: every rank gets the
    same answer at the same step, one step after the flag was raised.
    """

    def __init__(self) -> None:
        self.group: Any = None
        self.in_flight: tuple[torch.Tensor, Any] | None = None

    def setup(self, world_size: int) -> None:
        """Create the CPU group; call on every rank at the same point (a collective)."""
        if world_size > 1 and dist.is_available() and dist.is_initialized():
            self.group = dist.new_group(backend="gloo")

    def poll(self, flag: bool) -> bool:
        """Send this rank's flag; return whether any rank's flag was up at the previous poll."""
        if self.group is None:
            return flag
        agreed = False
        if self.in_flight is not None:
            votes, work = self.in_flight
            work.wait()
            agreed = bool(votes.item())
        votes = torch.tensor([int(flag)], dtype=torch.int32)
        self.in_flight = (votes, dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.group, async_op=True))
        return agreed

    def close(self) -> None:
        if self.in_flight is not None:
            self.in_flight[1].wait()
            self.in_flight = None


class PreemptionCheckpoint(Callback):
    """On ``signal_name``, save ``<checkpoint dir>/last.ckpt`` at the next step boundary, stop, and requeue.

    Args:
        signal_name: The signal announcing preemption (``SIGUSR1`` matches ``#SBATCH --signal=SIGUSR1@90``).
        requeue: Under SLURM, requeue the job after saving (needs ``#SBATCH --requeue``).
        filename: Checkpoint file name; it must start with ``last`` for ``--ckpt_path=last`` to find it.
    """

    def __init__(self, signal_name: str = "SIGUSR1", requeue: bool = True, filename: str = "last.ckpt") -> None:
        if not filename.startswith("last") or not filename.endswith(".ckpt"):
            raise ValueError(f"--preemption.filename={filename} must look like last*.ckpt so --ckpt_path=last finds it")
        self.signal_number = signal.Signals[signal_name.upper()]
        self.requeue = requeue
        self.filename = filename
        self.received = False
        self._previous_handler: Any = None
        self._last_step_seen = -1
        self._pending = False  # agreed to stop, waiting for the validation this step triggers
        self._saved = False
        self._saved_path: Path | None = None
        self._vote = AnyRankVote()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = True  # act later, at a step boundary, never inside the handler

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        environment = trainer._accelerator_connector.cluster_environment
        if isinstance(environment, SLURMEnvironment):
            environment.auto_requeue = False  # this callback replaces Lightning's in-handler save and requeue
        self._previous_handler = signal.signal(self.signal_number, self._handle)
        self._vote.setup(trainer.world_size)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._vote.close()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._previous_handler is not None:
            signal.signal(self.signal_number, self._previous_handler)
            self._previous_handler = None

    def checkpoint_path(self, trainer: L.Trainer) -> Path:
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath:
            return Path(checkpoint.dirpath) / self.filename
        return Path(trainer.default_root_dir) / "checkpoints" / self.filename

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._last_step_seen:
            return  # mid-accumulation: no optimizer step has finished since the last check
        self._last_step_seen = trainer.global_step
        if self._pending:  # the validation expected after the previous step did not come: stop now
            self._save(trainer)
            self._stop(trainer)
        if not self._vote.poll(self.received):  # any rank signalled (seen one step later under ddp)
            return
        if validation_follows(trainer, batch_idx):
            # Saving now would resume after that validation and never run it: save once it has run.
            self._pending = True
            return
        self._save(trainer)
        self._stop(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending and not self._saved and not trainer.sanity_checking:
            # ModelCheckpoint saves after this hook, from the same state; stop at the next training hook
            self._save(trainer)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._saved:
            self._stop(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending:
            if not self._saved:
                self._save(trainer)
            self._stop(trainer)

    def _save(self, trainer: L.Trainer) -> None:
        self._saved_path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(self._saved_path)  # every rank calls it; rank 0 writes
        trainer.strategy.barrier("preemption")  # every rank is done before a requeue can end the job step
        self._saved = True

    def _stop(self, trainer: L.Trainer) -> None:
        job_id = slurm_job_id()
        requeued = False
        if self.requeue and job_id and trainer.is_global_zero:
            # `scontrol requeue` ends the running job at once (SIGTERM to every task): write the logs first.
            # The slurm/ scripts pass --preemption.requeue=false and requeue after all ranks have exited instead.
            for logger in trainer.loggers:
                logger.save()
            result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, check=False)
            requeued = result.returncode == 0
            if not requeued:
                log.warning("scontrol requeue %s failed: %s", job_id, result.stderr.strip())
        raise Preempted(
            f"saved {self._saved_path} at step {trainer.global_step}"
            + (f" and requeued SLURM job {job_id}" if requeued else "")
            + "; resume with --ckpt_path=last (same --trainer.default_root_dir)."
        )


def validation_follows(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether Lightning validates (or ends the epoch) right after this training batch."""
    if trainer.is_last_batch:
        return True
    every = trainer.val_check_batch
    return (
        trainer.enable_validation
        and isinstance(every, int)
        and every > 0
        and (batch_idx + 1) % every == 0
        and (
            trainer.check_val_every_n_epoch is None
            or (trainer.current_epoch + 1) % trainer.check_val_every_n_epoch == 0
        )
    )
