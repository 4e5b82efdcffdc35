"""Where every rank is when a multi-process run hangs: each rank's stacks on ``SIGUSR2`` (``faulthandler``, so a rank
blocked in C answers too), and a report naming the rank a failed collective waited for (``hang_report.py``)."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from multigpu.errors import TrainingStopped, describe, one_paragraph
from multigpu.errors.failures import attach_collective_report, collective_failure, spawned_collective_failure
from multigpu.errors.reporting import speak_for_the_run
from multigpu.faults.hang_report import (
    MARK,
    RankView,
    collective_of,
    first_failure_report,
    format_stack,
    frames_of_traceback,
    frames_of_traceback_text,
    hang_report,
    latest_main_stack,
    user_frame,
)
from multigpu.faults.processes import HEARTBEAT_S, process_gone, process_start

#: the signal every rank dumps its stacks on (SIGUSR1 is the preemption notice)
DUMP_SIGNAL = signal.SIGUSR2
DUMP_WAIT_S = 2.0
POLL_S = 0.01
STATE_EVERY_S = 1.0
STACKS_DIR = "stacks"
FAILED = "failed in a collective"
#: a finished rank answers the dump signal no more
FINISHED = "finished"


def stacks_folder(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / STACKS_DIR


def run_dir_of(trainer: L.Trainer) -> Path:
    """The run directory: the checkpoint folder's parent (``<run dir>/checkpoints``), else ``default_root_dir``."""
    checkpoint = trainer.checkpoint_callback
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath:
        return Path(checkpoint.dirpath).parent
    return Path(trainer.default_root_dir)


def read_states(folder: Path) -> dict[int, dict[str, Any]]:
    """Every rank's ``rank-<N>.json`` in ``folder``, by rank."""
    states: dict[int, dict[str, Any]] = {}
    for path in folder.glob("rank-*.json"):
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(path.read_text())
            states[int(state["rank"])] = state
    return states


def alive_here(state: dict[str, Any]) -> bool:
    """Whether the state file's process runs on this host and is the same process (not a reused pid)."""
    if state.get("hostname") != socket.gethostname() or not state.get("pid"):
        return False
    started = state.get("started")
    return started is not None and process_gone(int(state["pid"]), started) is None


@dataclass(frozen=True)
class DumpMark:
    """A live rank's process and the size of its stack file before a dump."""

    pid: int
    size: int


def dump_marks(folder: Path, states: dict[int, dict[str, Any]], skip: int | None = None) -> dict[int, DumpMark]:
    """Where the next dump of every live rank of this host but ``skip`` begins, by rank."""
    marks: dict[int, DumpMark] = {}
    for rank, state in states.items():
        if rank != skip and alive_here(state):
            path = folder / f"rank-{rank}.txt"
            marks[rank] = DumpMark(int(state["pid"]), path.stat().st_size if path.is_file() else 0)
    return marks


def signal_ranks(folder: Path, states: dict[int, dict[str, Any]], skip: int | None = None) -> dict[int, DumpMark]:
    """Send the dump signal to every live rank of this host but ``skip``; return the marks of those signalled."""
    marks = dump_marks(folder, states, skip)
    for rank, mark in list(marks.items()):
        try:
            os.kill(mark.pid, DUMP_SIGNAL)
        except (ProcessLookupError, PermissionError):
            del marks[rank]
    return marks


def _signal_masks(status: Path) -> dict[str, int]:
    masks = {}
    for line in status.read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn"):
            masks[name] = int(value.strip(), 16)
    return masks


def dump_state(pid: int) -> str:
    """``"ignored"`` (it will never dump), ``"busy"`` (the signal is pending, or its handler is writing: the kernel
    blocks a signal in the thread that runs its handler, faulthandler's has no ``SA_NODEFER``), else ``"done"``."""
    bit = 1 << (DUMP_SIGNAL - 1)
    try:
        process = _signal_masks(Path(f"/proc/{pid}/status"))
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return "done"
    if process.get("SigIgn", 0) & bit:
        return "ignored"
    busy = process.get("ShdPnd", 0) & bit
    for thread in threads:  # after the process's pending set: a signal it held moves to a thread, never back
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            masks = _signal_masks(thread / "status")
            busy |= (masks.get("SigPnd", 0) | masks.get("SigBlk", 0)) & bit
    return "busy" if busy else "done"


def wait_for_dumps(folder: Path, marks: dict[int, DumpMark], timeout_s: float = DUMP_WAIT_S) -> dict[int, str]:
    """The dump each rank of ``marks`` appended, read once the file grew and the process is done with the signal; a
    rank that ignores it is waited for until its state file says it failed or finished."""
    deadline = time.monotonic() + timeout_s
    dumps: dict[int, str] = {}
    waiting = dict(marks)
    while waiting:
        for rank, mark in list(waiting.items()):
            path = folder / f"rank-{rank}.txt"
            size = path.stat().st_size if path.is_file() else 0
            state = dump_state(mark.pid)
            if state == "ignored":
                if _phase(folder, rank) in (FAILED, FINISHED):  # written after its own stack, and after the
                    del waiting[rank]  # signal was ignored: a reader's next look finds its stack of record
            elif size > mark.size and state == "done" and path.stat().st_size == size:
                with open(path, "rb") as handle:
                    handle.seek(mark.size)
                    dumps[rank] = handle.read(size - mark.size).decode(errors="replace")
                del waiting[rank]
        if waiting and time.monotonic() > deadline:
            break
        if waiting:
            time.sleep(POLL_S)
    return dumps


def _phase(folder: Path, rank: int) -> str | None:
    try:
        return json.loads((folder / f"rank-{rank}.json").read_text()).get("phase")
    except (OSError, ValueError):
        return None


def failure_file(folder: Path, rank: int) -> Path:
    return folder / f"error-rank-{rank}.json"


def record_failure(folder: Path, rank: int, exception: BaseException) -> None:
    """Write what a rank raised, and the user's line it raised at, for the other ranks' reports."""
    frame = user_frame(frames_of_traceback(exception.__traceback__))
    failure = {"rank": rank, "error": describe(exception), "where": str(frame) if frame else "", "time": time.time()}
    with contextlib.suppress(OSError):
        temporary = failure_file(folder, rank).with_suffix(".tmp")
        temporary.write_text(json.dumps(failure))
        os.replace(temporary, failure_file(folder, rank))


def first_failure(folder: Path, ranks: Iterable[int], since: float) -> dict[str, Any] | None:
    """The earliest error another rank of this run recorded after ``since`` (this process's start)."""
    failures = []
    for rank in ranks:
        with contextlib.suppress(OSError, ValueError):
            failure = json.loads(failure_file(folder, rank).read_text())
            if failure.get("time", 0) >= since:
                failures.append(failure)
    return min(failures, key=lambda f: f["time"], default=None)


class StackDumps(Callback):
    """Every rank dumps its stacks on ``SIGUSR2``; a collective that fails is reported with every rank's place."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.rank = 0
        self.step = 0
        self.phase = "setup"
        # the file, the thread and its event exist from setup on: ddp_spawn pickles the callbacks before that
        self._file: IO[str] | None = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._state: dict[str, Any] = {}
        self._since = 0.0  # older error files are an earlier run's

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size == 1 or self._file is not None:
            return
        self.rank = trainer.global_rank
        self._since = time.time()
        self.folder = stacks_folder(run_dir_of(trainer))
        self.folder.mkdir(parents=True, exist_ok=True)
        self._file = open(self.folder / f"rank-{self.rank}.txt", "a")  # noqa: SIM115 (faulthandler keeps its fd)
        pid = os.getpid()
        self._file.write(f"{MARK}rank {self.rank}, pid {pid}, from {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self._file.flush()  # before faulthandler writes to the descriptor itself
        faulthandler.register(DUMP_SIGNAL, file=self._file, all_threads=True, chain=False)
        self._state = {"rank": self.rank, "pid": pid, "hostname": socket.gethostname(), "started": process_start(pid)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_state, name="stack-dumps-state", daemon=True)
        self._thread.start()

    def _keep_state(self) -> None:
        written: tuple[Any, ...] = ()
        last = 0.0
        while True:
            now = (self.step, self.phase)
            if now != written or time.monotonic() - last > HEARTBEAT_S:
                self._write_state()
                written, last = now, time.monotonic()
            if self._stop is None or self._stop.wait(STATE_EVERY_S):
                return

    def _write_state(self) -> None:
        assert self.folder is not None
        path = self.folder / f"rank-{self.rank}.json"
        state = {**self._state, "step": self.step, "phase": self.phase, "updated": time.time()}
        with contextlib.suppress(OSError):  # a full disk must not stop training
            temporary = path.with_name(f".{path.name}.tmp")
            temporary.write_text(json.dumps(state))
            os.replace(temporary, path)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is not None and multiprocessing.parent_process() is not None:
            # a ddp_spawn worker, where Lightning runs no on_exception: torch SIGTERMs the workers left when one
            # fails, and each dumps first (registered after Lightning's signal handlers, which would replace it)
            faulthandler.register(signal.SIGTERM, file=self._file, all_threads=True, chain=True)

    # plain attributes: no file I/O and no host sync in the step, the daemon thread writes them
    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.step, self.phase = trainer.global_step, "training_step"

    def on_before_backward(self, *args: Any) -> None:
        self.phase = "backward"

    def on_before_optimizer_step(self, *args: Any) -> None:
        self.phase = "optimizer_step"

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.step, self.phase = trainer.global_step, "between steps (callbacks, checkpoints, the next batch)"

    def on_validation_batch_start(self, *args: Any) -> None:
        self.phase = "validation_step"

    def on_validation_end(self, *args: Any) -> None:
        self.phase = "after validation"

    def on_save_checkpoint(self, *args: Any) -> None:
        self.phase = "save_checkpoint"

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self.folder is None:
            if spawned_collective_failure(exception):
                self._report_spawned(trainer, exception)
            return
        if not collective_failure(exception):
            if not isinstance(exception, TrainingStopped):
                record_failure(self.folder, self.rank, exception)
            return
        # the ranks this process started leave Lightning's watch: its observer thread would SIGKILL this process as
        # soon as one of them exits (StopOtherRanksOnError, after this callback, still stops them)
        speak_for_the_run(trainer)
        others = [rank for rank in range(trainer.world_size) if rank != self.rank]
        failure = first_failure(self.folder, others, since=self._since)
        if failure is not None:  # another rank raised: its error is the one to read, not this rank's lost peer
            self.phase = FAILED
            collective = collective_of(frames_of_traceback(exception.__traceback__))
            attach_collective_report(exception, first_failure_report(self.rank, collective, failure))
            return
        own = frames_of_traceback(exception.__traceback__)  # where this rank waited: its dump would show this hook
        if threading.current_thread() is threading.main_thread():
            # from here on this rank's stack of record is its exception's: another rank reporting at the same
            # time (a desync fails on both sides) must not get a dump of this hook instead
            faulthandler.unregister(DUMP_SIGNAL)
            signal.signal(DUMP_SIGNAL, signal.SIG_IGN)
        if self._file is not None:
            self._file.write(format_stack(own))
            self._file.flush()
        # said once its own stack is in its file (and the signal ignored): a rank that reads this phase reads that
        self.phase = FAILED
        self._write_state()
        states = read_states(self.folder)
        reporting = {rank for rank, state in states.items() if state.get("phase") == FAILED and rank != self.rank}
        signalled = signal_ranks(self.folder, {r: s for r, s in states.items() if r not in reporting}, skip=self.rank)
        dumps = wait_for_dumps(self.folder, signalled)
        states = {**states, **read_states(self.folder)}  # a rank that began to report while this one waited
        for rank, state in states.items():
            path = self.folder / f"rank-{rank}.txt"
            if rank not in dumps and state.get("phase") == FAILED and rank != self.rank and path.is_file():
                dumps[rank] = path.read_text()  # its latest stack is its own exception's
        views = [RankView(self.rank, {**states.get(self.rank, {}), "step": self.step}, own)]
        for rank in range(trainer.world_size):
            if rank == self.rank:
                continue
            view = RankView(rank, states.get(rank, {}))
            if rank in dumps:
                view.frames = latest_main_stack(dumps[rank])
            elif rank not in states:
                view.missing = "no state file: it never started training"
            elif view.state.get("hostname") != socket.gethostname():
                view.missing = f"on host {view.state.get('hostname')}: run `python -m multigpu.stacks` there"
            elif rank not in signalled:
                view.missing = "its process is gone: it crashed or was killed (out of memory?)"
            else:
                view.missing = f"it did not answer {DUMP_SIGNAL.name} within {DUMP_WAIT_S:g} s"
            views.append(view)
        text = hang_report(self.rank, describe(exception), sorted(views, key=lambda v: v.rank), self.folder)
        # rank 0 failing in a collective too reports the same hang, from its side: this rank's report is kept
        zero = next((view for view in views if view.rank == 0 and view.rank != self.rank), None)
        waits = zero is not None and (
            zero.state.get("phase") == FAILED or (zero.frames is not None and collective_of(zero.frames) is not None)
        )
        attach_collective_report(exception, text, rank_zero_reports=waits)
        # a rank stuck in its own code never times out: under srun (which leaves the other tasks running when one
        # fails) it would hold the job until its time limit; its stacks are taken, so end it (this host only)
        stuck = [
            view
            for view in views
            if view.rank != self.rank and view.frames is not None and collective_of(view.frames) is None
        ]
        for view in stuck:
            if alive_here(view.state):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(view.state["pid"]), signal.SIGKILL)

    def _report_spawned(self, trainer: L.Trainer, exception: BaseException) -> None:
        """A ddp_spawn worker's failed collective: its traceback (sent as text) and the others' dumps at SIGTERM."""
        folder = stacks_folder(run_dir_of(trainer))
        failed = int(getattr(exception, "error_index", 0))
        states = read_states(folder)
        text = str(exception)
        error = text.strip().splitlines()[-1]
        views = [RankView(failed, states.get(failed, {}), frames_of_traceback_text(text))]
        for rank in range(trainer.world_size):
            if rank != failed:
                dump = (folder / f"rank-{rank}.txt").read_text() if (folder / f"rank-{rank}.txt").is_file() else ""
                view = RankView(rank, states.get(rank, {}), latest_main_stack(dump))
                view.missing = "" if view.frames else "its process left no dump"
                views.append(view)
        attach_collective_report(exception, hang_report(failed, one_paragraph(error), views, folder))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._file is None:
            return
        if self._stop is not None and self._thread is not None:
            self._stop.set()
            self._thread.join()
        self.phase = FINISHED
        self._write_state()
        faulthandler.unregister(DUMP_SIGNAL)
        faulthandler.unregister(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            # a late `pkill -USR2` must not kill the exiting rank (SIGUSR2's default action)
            signal.signal(DUMP_SIGNAL, signal.SIG_IGN)
        self._file.close()
        self._file = None
