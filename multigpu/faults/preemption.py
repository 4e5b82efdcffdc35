"""Stop cleanly on a signal: save ``last.ckpt`` at a step boundary the ranks agree on, exit non-zero, requeue on SLURM
(docs/checkpoints.md). The handler only sets a flag: saving inside it could land mid-step, mid-collective."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from multigpu.checkpoints.background import wait_for_checkpoints
from multigpu.compat import skip_per_step_sigterm_broadcast, validation_follows
from multigpu.errors import Preempted
from multigpu.steps import EveryNSteps

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_EXIT_CODES = (Preempted.exit_code, *(128 + s for s in STOP_SIGNALS))
#: a terminal sends Ctrl-C to every process, and ddp_spawn's launcher forwards it too: the same key press
SAME_KEY_PRESS_S = 0.5
RESUME_HINT = "--ckpt_path=last (same --trainer.default_root_dir)."


class AnyRankVote:
    """The largest value any rank raised, agreed one step late by an asynchronous gloo all-reduce (no device sync)."""

    def __init__(self) -> None:
        self.group: Any = None
        self.in_flight: tuple[torch.Tensor, Any] | None = None

    def setup(self, world_size: int) -> None:
        """Create the CPU group: a collective, called on every rank."""
        if world_size > 1 and dist.is_available() and dist.is_initialized() and self.group is None:
            self.group = dist.new_group(backend="gloo")

    def poll(self, value: int) -> int:
        """Send this rank's value; return the largest value any rank sent at the previous poll."""
        if self.group is None:
            return value
        agreed = 0
        if self.in_flight is not None:
            votes, work = self.in_flight
            work.wait()
            agreed = int(votes.item())
        votes = torch.tensor([value], dtype=torch.int32)
        self.in_flight = (votes, dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.group, async_op=True))
        return agreed

    def close(self) -> None:
        if self.in_flight is not None:
            self.in_flight[1].wait()
            self.in_flight = None


@contextlib.contextmanager
def forward_stop_signals_to_workers(strategy: str | None) -> Iterator[None]:
    """Pass stop signals on to ``ddp_spawn``'s workers, which save and stop, rather than leave or kill them unsaved."""
    spawns = isinstance(strategy, str) and strategy.startswith(("ddp_spawn", "ddp_fork", "ddp_notebook"))
    if not spawns or threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: FrameType | None) -> None:
        for worker in multiprocessing.active_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signum)  # type: ignore[arg-type]

    signals = (signal.SIGUSR1, *STOP_SIGNALS)
    previous = {signum: signal.signal(signum, forward) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def training_ends_now(trainer: L.Trainer) -> bool:
    if 0 < trainer.max_steps <= trainer.global_step:
        return True
    max_epochs = trainer.max_epochs
    return bool(trainer.is_last_batch and max_epochs is not None and 0 < max_epochs <= trainer.current_epoch + 1)


class PreemptionCheckpoint(Callback):
    """On a stop signal, save ``<checkpoint dir>/last.ckpt`` at the next step boundary, stop, and requeue.

    Args:
        signal_name: The preemption notice (exit code 75; ``SIGUSR1`` matches ``#SBATCH --signal=SIGUSR1@90``).
            ``SIGTERM`` and ``SIGINT`` also save and stop, with exit codes 143 and 130.
        requeue: Under SLURM, requeue the job after saving on the preemption notice (needs ``#SBATCH --requeue``).
        filename: Checkpoint file name; it must start with ``last`` for ``--ckpt_path=last`` to find it.
    """

    def __init__(self, signal_name: str = "SIGUSR1", requeue: bool = True, filename: str = "last.ckpt") -> None:
        if not filename.startswith("last") or not filename.endswith(".ckpt"):
            raise ValueError(f"--preemption.filename={filename} must look like last*.ckpt so --ckpt_path=last finds it")
        self.signal_number = signal.Signals[signal_name.upper()]
        self.requeue = requeue
        self.filename = filename
        self.received = 0
        self._first_sigint = 0.0
        self._stop_signal = 0
        self._previous_handlers: dict[int, Any] = {}
        self._new_step = EveryNSteps()
        self._saved_path: Path | None = None
        self._vote = AnyRankVote()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self._first_sigint and time.monotonic() - self._first_sigint > SAME_KEY_PRESS_S:
            raise Preempted(
                "a second Ctrl-C stopped training at once, without saving; resume from the last saved checkpoint"
                f" with {RESUME_HINT}",
                exit_code=128 + signal.SIGINT,
            )
        if signum == signal.SIGINT and not self._first_sigint:
            self._first_sigint = time.monotonic()
        self.received = max(self.received, signum)  # act later, at a step boundary, never inside the handler

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._vote.setup(trainer.world_size)
        if trainer.world_size > 1:
            skip_per_step_sigterm_broadcast(trainer)

    def _take_signals(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning registers its handlers just before training: taken over at the sanity check, or at train start
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (self.signal_number, *STOP_SIGNALS):
            self._previous_handlers.setdefault(signum, signal.signal(signum, self._handle))

    on_sanity_check_start = on_train_start = _take_signals

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._vote.close()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous_handlers = {}

    def checkpoint_path(self, trainer: L.Trainer) -> Path:
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath:
            return Path(checkpoint.dirpath) / self.filename
        return Path(trainer.default_root_dir) / "checkpoints" / self.filename

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._stop_signal or not self._new_step.due(trainer.global_step):
            return
        agreed = self._vote.poll(self.received)
        if not agreed or training_ends_now(trainer):
            return
        self._stop_signal = agreed
        if validation_follows(trainer):
            return  # save once that validation and ModelCheckpoint are done, or it would never run on resume
        self._save(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._stop_signal or self._saved_path is not None or trainer.sanity_checking:
            return
        # ModelCheckpoint runs this hook last: run first, so that the saved state holds its decision on this validation
        for checkpoint in trainer.checkpoint_callbacks:
            checkpoint.on_validation_end(trainer, pl_module)
        self._save(trainer)

    def _stop_once_saved(self, trainer: L.Trainer, *args: Any) -> None:
        if self._saved_path is not None:
            self._stop(trainer)

    on_train_batch_start = on_train_epoch_end = _stop_once_saved  # type: ignore[assignment]

    def _save(self, trainer: L.Trainer) -> None:
        self._saved_path = self.checkpoint_path(trainer)
        # weights_only given: left unset, Lightning logs at every save that it defaulted to it
        trainer.save_checkpoint(self._saved_path, weights_only=False)
        wait_for_checkpoints(trainer)
        trainer.strategy.barrier("preemption")  # every rank is done before a requeue can end the job step

    @staticmethod
    def _requeue(trainer: L.Trainer, job_id: str, saved: str) -> str:
        """``scontrol requeue`` from rank 0; the message to stop with."""
        # the requeue ends the job step at once
        for logger in trainer.loggers:
            logger.save()
        print(
            f"{Preempted.label}: {saved}; requeuing SLURM job {job_id}, which resumes from it.",
            file=sys.stderr,
            flush=True,
        )
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            return f"requeued SLURM job {job_id}."
        log.warning("scontrol requeue %s failed: %s", job_id, result.stderr.strip())
        return f"scontrol requeue {job_id} failed, the job is not requeued; resume with {RESUME_HINT}"

    def _stop(self, trainer: L.Trainer) -> None:
        wait_for_checkpoints(trainer)
        preempted = self._stop_signal == self.signal_number
        job_id = os.environ.get("SLURM_JOB_ID")
        if "SLURM_ARRAY_JOB_ID" in os.environ and "SLURM_ARRAY_TASK_ID" in os.environ:
            job_id = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        name = signal.Signals(self._stop_signal).name
        saved = f"{name}: saved {self._saved_path} at step {trainer.global_step}"
        message = f"{saved}; resume with {RESUME_HINT}"
        if preempted and self.requeue and job_id and trainer.is_global_zero:
            message = self._requeue(trainer, job_id, saved)
        exit_code = Preempted.exit_code if preempted else 128 + self._stop_signal
        if multiprocessing.parent_process() is not None:
            # a ddp_spawn worker: an exception would reach the launcher as a traceback, an exit status as it is
            if trainer.is_global_zero:
                print(f"preempted: {message}", file=sys.stderr, flush=True)
            raise SystemExit(exit_code)
        raise Preempted(message, exit_code=exit_code)
