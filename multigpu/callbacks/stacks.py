"""Where every rank is when a multi-process run hangs: each rank's Python stacks on ``SIGUSR2``, and, when a
collective times out or loses its connection, a report naming the rank that did not arrive and its line.

At setup every rank of a run of several processes registers ``faulthandler`` for ``SIGUSR2``: the interpreter
writes all its threads' stacks to ``<run dir>/stacks/rank-<N>.txt`` from the C signal handler, so a rank blocked
in a C collective, a sleep or a read answers too. Beside it, ``rank-<N>.json`` holds the rank's pid, host, step and
phase, written by a daemon thread from attributes the hooks set (no file I/O and no host sync in the step).

The functions on dumps are pure (text in, frames out), so that the report and ``python -m multigpu.stacks`` share them.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import multiprocessing
import os
import re
import signal
import socket
import sysconfig
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from multigpu.errors import (
    TrainingStopped,
    attach_collective_report,
    collective_failure,
    describe,
    one_paragraph,
    spawned_collective_failure,
)

#: the signal every rank dumps its stacks on (SIGUSR1 is the preemption notice)
DUMP_SIGNAL = signal.SIGUSR2
#: how long the reporting rank waits for the other ranks' dumps after signalling them
DUMP_WAIT_S = 2.0
#: how often the daemon thread may rewrite ``rank-<N>.json`` (only when the step or phase changed, or to show
#: the rank is alive every ``HEARTBEAT_S``)
STATE_EVERY_S = 1.0
HEARTBEAT_S = 30.0
STACKS_DIR = "stacks"
#: the phase of a rank whose collective failed, while it reports
FAILED = "failed in a collective"

#: the template's own code, which a report looks past to the user's frame (its models and data, the user's
#: rooms, count as the user's)
#: the engine's own code (installed or, here, editable): machinery, never the user's
ENGINE_DIR = Path(__file__).resolve().parents[1]
STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


# -- dumps as frames (pure) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass
class ThreadStack:
    """One thread of a dump; ``frames`` innermost first, as faulthandler writes them."""

    ident: str
    current: bool = False
    frames: list[Frame] = field(default_factory=list)


#: how the template's own lines in a stack file begin (faulthandler's never do)
MARK = "# "
THREAD_HEADER = re.compile(r"^(Current thread|Thread|Stack)\s*(0x[0-9a-fA-F]+)?.*\(most recent call first\):\s*$")
FRAME_LINE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.+?)\s*$')


def parse_dumps(text: str) -> list[list[ThreadStack]]:
    """The dumps in ``text`` (faulthandler's output, appended once per signal), oldest first, each a list of its
    threads. faulthandler writes no header per dump: a thread seen twice starts the next dump, and so does a
    ``#`` line (``MARK``, written by each new process of a run directory resumed, and before a reporting rank's
    own stack)."""
    dumps: list[list[ThreadStack]] = []
    thread: ThreadStack | None = None
    marked = False
    for line in text.splitlines():
        if line.startswith(MARK):
            marked, thread = True, None
            continue
        header = THREAD_HEADER.match(line)
        if header:
            ident = header.group(2) or header.group(1)
            if not dumps or marked or any(t.ident == ident for t in dumps[-1]):
                dumps.append([])
                marked = False
            thread = ThreadStack(ident, current=header.group(1) != "Thread")
            dumps[-1].append(thread)
            continue
        frame = FRAME_LINE.match(line)
        if frame and thread is not None:
            thread.frames.append(Frame(frame["file"], int(frame["line"]), frame["function"]))
    return dumps


def main_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The main thread of a dump: the one not started by ``threading`` (its outermost frame is not
    ``_bootstrap``), whichever thread the signal happened to interrupt."""
    started = [t for t in threads if t.frames and t.frames[-1].function != "_bootstrap"]
    # a thread started by `_thread` (as execnet's) has no `_bootstrap` either: the main thread began at a module
    entry = [t for t in started if t.frames[-1].function in ("<module>", "_run_module_as_main")]
    return next(iter(entry + started), None) or next((t for t in threads if t.current), None)


def frames_of_traceback(tb: Any) -> list[Frame]:
    """An exception's traceback as frames, innermost first (the reporting rank's own stack at its failure)."""
    return [Frame(f.filename, f.lineno or 0, f.name) for f in reversed(traceback.extract_tb(tb))]


TRACEBACK_LINE = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<function>.+?)\s*$')


def frames_of_traceback_text(text: str) -> list[Frame]:
    """A Python traceback as printed (a ddp_spawn worker sends its own as text) as frames, innermost first."""
    matches = [m for m in map(TRACEBACK_LINE.match, text.splitlines()) if m]
    return [Frame(m["file"], int(m["line"]), m["function"]) for m in reversed(matches)]


def is_library(file: str) -> bool:
    """Code of the libraries, the standard library, the interpreter or the engine (``multigpu/``): not where a user
    looks first."""
    if file.startswith("<") or "site-packages" in file or "dist-packages" in file or file.startswith(STDLIB):
        return True
    return Path(file).is_relative_to(ENGINE_DIR)


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the user's own code, or None."""
    return next((f for f in frames if not is_library(f.file)), None)


#: the collectives of torch.distributed and Lightning's strategies, as their frames are named
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "send",
    "recv",
    "wait",
    "reduce_boolean_decision",
)


def collective_of(frames: list[Frame]) -> str | None:
    """The collective a stack waits in (innermost first), or None where it waits in none: a torch.distributed
    call, Lightning's ``reduce``/``barrier``/``broadcast``, or the gradient all-reduce DDP runs inside backward."""
    for frame in frames:
        file = frame.file.replace("\\", "/")
        if "torch/distributed/" in file and frame.function in COLLECTIVES:
            return f"torch.distributed.{frame.function}"
        if file.endswith("torch/distributed/distributed_c10d.py") and not frame.function.startswith("_"):
            return f"torch.distributed.{frame.function}"  # the process group's own calls (all_gather_single, ...)
        if "torch/distributed/fsdp/" in file and frame.function.startswith("foreach_"):
            return f"FSDP2's {frame.function.removeprefix('foreach_').replace('_', '-')} of the parameters"
        if "torch/distributed/tensor/" in file and "redistribute" in frame.function:
            return "a DTensor redistribute (tensor parallel)"
        if "/lightning/" in file and "/strategies/" in file and frame.function in COLLECTIVES:
            return f"Lightning's strategy.{frame.function}"
        if "torch/autograd/" in file and "backward" in frame.function:
            return "DDP's gradient all-reduce in backward"
    return None


#: phases told by a frame's function name, the innermost match wins
PHASES = (
    ("__next__", "loading data (the dataloader's __next__)"),
    ("save_checkpoint", "save_checkpoint"),
    ("backward", "backward"),
    ("training_step", "training_step"),
    ("validation_step", "validation_step"),
    ("test_step", "test_step"),
    ("predict_step", "predict_step"),
    ("optimizer_step", "optimizer_step"),
)


def phase_of(frames: list[Frame]) -> str | None:
    """What the stack is doing, in the words of a training step, or None."""
    for frame in frames:
        for function, phase in PHASES:
            if frame.function == function:
                return phase
        if frame.function.startswith("on_") and not is_library(frame.file):
            return frame.function  # a hook of the user's callback or module, e.g. on_train_epoch_end
    return None


# -- the report (pure) ---------------------------------------------------------------------------------------------


@dataclass
class RankView:
    """What is known of one rank when the report is written: its state file, its main-thread stack (innermost
    first; None when it sent none), and why there is none."""

    rank: int
    state: dict[str, Any] = field(default_factory=dict)
    frames: list[Frame] | None = None
    missing: str = ""


def rank_list(ranks: Iterable[int]) -> str:
    """``rank 3`` or ``ranks 0, 2-5``."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    start = previous = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(spans)


def where(view: RankView) -> str:
    """``step 3, in training_step at file:line in function``: the step and phase, from the stack or the state."""
    parts = []
    if view.state.get("step") is not None:
        parts.append(f"step {view.state['step']}")
    phase = (phase_of(view.frames) if view.frames else None) or view.state.get("phase")
    if phase:
        parts.append(f"in {phase}")
    frame = user_frame(view.frames) if view.frames else None
    if frame is not None:
        parts.append(f"at {frame}")
    return ", ".join(parts)


def hang_report(failed_rank: int, error: str, views: list[RankView], folder: str | os.PathLike) -> str:
    """The one paragraph for a collective that timed out or lost its connection on ``failed_rank``: the ranks that
    did not arrive and where they are, the collective the others wait in, and the folder of every rank's stacks."""
    stuck = [v for v in views if v.frames is not None and collective_of(v.frames) is None]
    gone = [v for v in views if v.frames is None]
    waiting: dict[str, list[RankView]] = {}
    for view in views:
        collective = collective_of(view.frames) if view.frames is not None else None
        if collective is not None:
            waiting.setdefault(collective, []).append(view)
    sentences = [f"a collective failed on rank {failed_rank} ({error})."]
    for view in stuck:
        sentences.append(f"Rank {view.rank} did not arrive: it is at {where(view) or 'an unknown place'}.")
    for view in gone:
        sentences.append(f"Rank {view.rank} sent no stack ({view.missing or 'unknown why'}).")
    for collective, group in waiting.items():
        steps = sorted({str(v.state.get("step")) for v in group if v.state.get("step") is not None})
        at = f" at step {', '.join(steps)}" if steps else ""
        ranks = rank_list(v.rank for v in group)
        # the user's line that called it: where ranks issue different collectives, each side's own place
        callers = sorted({str(frame) for v in group if (frame := user_frame(v.frames or []))})
        called = f", called from {'; '.join(callers)}" if callers else ""
        sentences.append(f"{ranks.capitalize()} {'waits' if len(group) == 1 else 'wait'} in {collective}{at}{called}.")
    if not stuck and not gone and len(waiting) > 1:
        sentences.append(
            "Every rank is in a collective, but not the same one: a collective that only some ranks call (under"
            " `if rank == 0`, or a `self.log(..., sync_dist=True)` under a condition) or uneven data across ranks."
            " TORCH_DISTRIBUTED_DEBUG=DETAIL checks each collective across the ranks and names the mismatch."
        )
    elif not stuck and not gone:
        sentences.append("Every rank is in the same collective: one may be slower than the timeout allows.")
    sentences.append(
        f"Fix: see what the rank that did not arrive does there that the others do not (docs/troubleshooting.md,"
        f' "My multi-GPU job hangs or is slow"); every rank\'s stacks are in {folder}'
        f" (`python -m multigpu.stacks {Path(folder).parent}`)."
    )
    return " ".join(sentences)


def first_failure_report(failed_rank: int, collective: str | None, failure: dict[str, Any]) -> str:
    """The paragraph of a rank whose collective failed because another rank raised first: one sentence for this
    rank, then the first failure, which is what the person must read (the survivors' errors only follow from it)."""
    waited = f" in {collective}" if collective else ""
    place = f" at {failure['where']}" if failure.get("where") else ""
    return (
        f"rank {failed_rank} lost the other ranks{waited} because rank {failure['rank']} failed first; its"
        f" traceback is above. The first failure: rank {failure['rank']}: {failure['error']}{place}."
    )


def shown_frames(frames: list[Frame]) -> list[Frame]:
    """The frames a person reads of a stack: the innermost one, where it is, then the user's own."""
    return [f for i, f in enumerate(frames) if i == 0 or not is_library(f.file)]


def group_stacks(stacks: dict[int, list[Frame]]) -> list[tuple[list[int], list[Frame]]]:
    """Ranks whose stacks show the same frames (the user's, and the collective they wait in), together: the
    groups in order of their lowest rank, each with its ranks and the first rank's frames."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for rank in sorted(stacks):
        frames = stacks[rank]
        key = (tuple(f for f in frames if not is_library(f.file)), collective_of(frames), phase_of(frames))
        groups.setdefault(key, []).append(rank)
    return [(ranks, stacks[ranks[0]]) for ranks in groups.values()]


def format_groups(stacks: dict[int, list[Frame]], states: dict[int, dict[str, Any]], missing: dict[int, str]) -> str:
    """The stacks of a run for a person: one block per group of ranks with the same stack, then the ranks
    without one."""
    blocks = []
    for ranks, frames in group_stacks(stacks):
        steps = sorted({states.get(r, {}).get("step") for r in ranks} - {None})
        collective = collective_of(frames)
        facts = [f"step {', '.join(map(str, steps))}"] if steps else []
        facts.append(phase_of(frames) or states.get(ranks[0], {}).get("phase") or "phase unknown")
        facts.append(f"waiting in {collective}" if collective else "not in a collective")
        lines = [f"{rank_list(ranks)}: {'; '.join(facts)}"]
        lines += [f"    {frame}" for frame in shown_frames(frames)]
        blocks.append("\n".join(lines))
    blocks += [f"{rank_list([rank])}: no stack ({why})" for rank, why in sorted(missing.items())]
    return "\n\n".join(blocks)


# -- the files of a run ---------------------------------------------------------------------------------------------


def stacks_folder(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / STACKS_DIR


def run_dir_of(trainer: L.Trainer) -> Path:
    """The run directory: the checkpoint folder's parent (``<run dir>/checkpoints``), else ``default_root_dir``."""
    checkpoint = trainer.checkpoint_callback
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath:
        return Path(checkpoint.dirpath).parent
    return Path(trainer.default_root_dir)


def process_start(pid: int) -> str | None:
    """When a process started (``/proc/<pid>/stat``), to tell a live rank from a later process with its pid;
    None where unknown (no such process, no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # field 22, counted after the command name


def read_states(folder: Path) -> dict[int, dict[str, Any]]:
    """Every rank's ``rank-<N>.json`` in ``folder``, by rank (a file being replaced is skipped)."""
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
    started = process_start(int(state["pid"]))
    return started is not None and started == state.get("started")


def signal_ranks(folder: Path, states: dict[int, dict[str, Any]], skip: int | None = None) -> dict[int, int]:
    """Send the dump signal to every live rank of this host but ``skip``; return the size each one's stack file
    had before, by rank, to read its new dump from."""
    signalled: dict[int, int] = {}
    for rank, state in states.items():
        if rank == skip or not alive_here(state):
            continue
        path = folder / f"rank-{rank}.txt"
        size = path.stat().st_size if path.is_file() else 0
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(state["pid"]), DUMP_SIGNAL)
            signalled[rank] = size
    return signalled


def wait_for_dumps(folder: Path, signalled: dict[int, int], timeout_s: float = DUMP_WAIT_S) -> dict[int, str]:
    """The text each signalled rank appended to its stack file, waiting up to ``timeout_s`` for all of them."""
    deadline = time.monotonic() + timeout_s
    grown: dict[int, str] = {}
    while True:
        for rank, size in signalled.items():
            path = folder / f"rank-{rank}.txt"
            if rank not in grown and path.is_file() and path.stat().st_size > size:
                time.sleep(0.1)  # the handler writes frame by frame: let it finish
                with open(path) as handle:
                    handle.seek(size)
                    grown[rank] = handle.read()
        if len(grown) == len(signalled) or time.monotonic() > deadline:
            return grown
        time.sleep(0.05)


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


def format_stack(frames: list[Frame]) -> str:
    """``frames`` (innermost first) as faulthandler writes a thread, so that the dump files read alike."""
    lines = [
        f"{MARK}this rank's own stack, where its collective failed",
        f"Current thread 0x{threading.get_ident():016x} (most recent call first):",
    ]
    lines += [f'  File "{f.file}", line {f.line} in {f.function}' for f in frames]
    return "\n".join(lines) + "\n"


def latest_main_stack(text: str) -> list[Frame] | None:
    dumps = parse_dumps(text)
    thread = main_thread(dumps[-1]) if dumps else None
    return thread.frames if thread is not None else None


# -- the callback -----------------------------------------------------------------------------------------------------


class StackDumps(Callback):
    """Every rank dumps its stacks on ``SIGUSR2``; a collective that fails is reported with every rank's place.

    Always on; does nothing in a run of one process. It comes before ``StopOtherRanksOnError``, which kills the
    other ranks on an error: their stacks are taken first.
    """

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
        self._since = 0.0  # when this process set up: older error files are an earlier run's

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
        """Rewrite ``rank-<N>.json`` when the step or phase changed, at most every ``STATE_EVERY_S``."""
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
        with contextlib.suppress(OSError):  # a full disk must not stop training; the report says what it lacks
            temporary = path.with_name(f".{path.name}.tmp")
            temporary.write_text(json.dumps(state))
            os.replace(temporary, path)  # readers never see half a file

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is not None and multiprocessing.parent_process() is not None:
            # a ddp_spawn worker: Lightning runs no on_exception there, so the launching process reports; torch
            # SIGTERMs the workers left when one fails, and each then dumps where it is before its own handler
            # runs (registered here, after Lightning's signal handlers, which would replace it)
            faulthandler.register(signal.SIGTERM, file=self._file, all_threads=True, chain=True)

    # the phase, set by the hooks as plain attributes: the daemon thread writes it
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
            if spawned_collective_failure(exception):  # the process that launched ddp_spawn workers
                self._report_spawned(trainer, exception)
            return
        if not collective_failure(exception):
            if not isinstance(exception, TrainingStopped):  # an agreed stop is no failure
                record_failure(self.folder, self.rank, exception)
            return
        self.phase = FAILED
        others = [rank for rank in range(trainer.world_size) if rank != self.rank]
        failure = first_failure(self.folder, others, since=self._since)
        if failure is not None:  # another rank raised: its error is the one to read, not this rank's lost peer
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
        attach_collective_report(exception, text)  # multigpu/errors.py prints it
        # a rank stuck in its own code never times out: under srun (which leaves the other tasks running when one
        # fails) it would hold the job until its time limit; its stacks are taken, so end it (this host only)
        for view in views:
            stuck = view.rank != self.rank and view.frames is not None and collective_of(view.frames) is None
            if stuck and alive_here(view.state):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(view.state["pid"]), signal.SIGKILL)

    def _report_spawned(self, trainer: L.Trainer, exception: BaseException) -> None:
        """The report of a ddp_spawn worker's failed collective, made by the launching process once torch has
        stopped the workers: the failed worker's traceback (sent as text) and the others' dumps at their SIGTERM."""
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
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.phase = "finished"
        self._write_state()
        faulthandler.unregister(DUMP_SIGNAL)
        faulthandler.unregister(signal.SIGTERM)  # where registered; puts back the handler it chained to
        if threading.current_thread() is threading.main_thread():
            # a late `pkill -USR2` (after training, while the rank exits) must not kill it: SIGUSR2's default action
            signal.signal(DUMP_SIGNAL, signal.SIG_IGN)
        self._file.close()
        self._file = None
