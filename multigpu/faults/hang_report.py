"""The report of where every rank is, from their stack dumps (pure: text in, paragraphs out), for
``multigpu/faults/stack_dumps.py`` and ``python -m multigpu.stacks``."""

from __future__ import annotations

import os
import re
import sysconfig
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: machinery a report looks past to the user's frame
ENGINE_DIR = Path(__file__).resolve().parents[1]
STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


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


#: how the engine's own lines in a stack file begin (faulthandler's never do)
MARK = "# "
THREAD_HEADER = re.compile(r"^(Current thread|Thread|Stack)\s*(0x[0-9a-fA-F]+)?.*\(most recent call first\):\s*$")
FRAME_LINE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.+?)\s*$')


def parse_dumps(text: str) -> list[list[ThreadStack]]:
    """The dumps in ``text``, oldest first, each a list of its threads."""
    # faulthandler writes no header per dump: a thread seen twice starts the next one, as does a MARK line
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
    """The thread not started by ``threading``, whichever thread the signal interrupted."""
    started = [t for t in threads if t.frames and t.frames[-1].function != "_bootstrap"]
    # a thread started by `_thread` (as execnet's) has no `_bootstrap` either: the main thread began at a module
    entry = [t for t in started if t.frames[-1].function in ("<module>", "_run_module_as_main")]
    return next(iter(entry + started), None) or next((t for t in threads if t.current), None)


def format_stack(frames: list[Frame]) -> str:
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


def frames_of_traceback(tb: Any) -> list[Frame]:
    return [Frame(f.filename, f.lineno or 0, f.name) for f in reversed(traceback.extract_tb(tb))]


TRACEBACK_LINE = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<function>.+?)\s*$')


def frames_of_traceback_text(text: str) -> list[Frame]:
    """A traceback as printed (a ddp_spawn worker sends its own as text), innermost first."""
    matches = [m for m in map(TRACEBACK_LINE.match, text.splitlines()) if m]
    return [Frame(m["file"], int(m["line"]), m["function"]) for m in reversed(matches)]


def is_library(file: str) -> bool:
    if file.startswith("<") or "site-packages" in file or "dist-packages" in file or file.startswith(STDLIB):
        return True
    return Path(file).is_relative_to(ENGINE_DIR)


def user_frame(frames: list[Frame]) -> Frame | None:
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
    for frame in frames:
        file = frame.file.replace("\\", "/")
        if "torch/distributed/" in file and frame.function in COLLECTIVES:
            return f"torch.distributed.{frame.function}"
        if file.endswith("torch/distributed/distributed_c10d.py") and not frame.function.startswith("_"):
            return f"torch.distributed.{frame.function}"  # the process group's own (all_gather_single, ...)
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
    for frame in frames:
        for function, phase in PHASES:
            if frame.function == function:
                return phase
        if frame.function.startswith("on_") and not is_library(frame.file):
            return frame.function  # a hook of the user's callback or module, e.g. on_train_epoch_end
    return None


@dataclass
class RankView:
    """One rank when the report is written; ``frames`` None where it sent no stack, ``missing`` saying why."""

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
    """``step 3, in training_step at file:line in function``."""
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
    """The paragraph for a collective that failed on ``failed_rank``: who did not arrive, and where each rank is."""
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
        "Fix: see what the rank that did not arrive does there that the others do not (the engine's"
        f' docs/troubleshooting.md, "My multi-GPU job hangs or is slow"); every rank\'s stacks are in {folder}'
        f" (`python -m multigpu.stacks {Path(folder).parent}`)."
    )
    return " ".join(sentences)


def first_failure_report(failed_rank: int, collective: str | None, failure: dict[str, Any]) -> str:
    waited = f" in {collective}" if collective else ""
    place = f" at {failure['where']}" if failure.get("where") else ""
    return (
        f"rank {failed_rank} lost the other ranks{waited} because rank {failure['rank']} failed first; its"
        f" traceback is above. The first failure: rank {failure['rank']}: {failure['error']}{place}."
    )


def shown_frames(frames: list[Frame]) -> list[Frame]:
    """The innermost frame, where the rank is, then the user's own."""
    return [f for i, f in enumerate(frames) if i == 0 or not is_library(f.file)]


def group_stacks(stacks: dict[int, list[Frame]]) -> list[tuple[list[int], list[Frame]]]:
    """Ranks with the same user frames, collective and phase, grouped in order of their lowest rank."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for rank in sorted(stacks):
        frames = stacks[rank]
        key = (tuple(f for f in frames if not is_library(f.file)), collective_of(frames), phase_of(frames))
        groups.setdefault(key, []).append(rank)
    return [(ranks, stacks[ranks[0]]) for ranks in groups.values()]


def format_groups(stacks: dict[int, list[Frame]], states: dict[int, dict[str, Any]], missing: dict[int, str]) -> str:
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
