"""The seconds from the process's start to the end of the first training step, split into its parts: marks the
command line takes as it builds the run, and the run plan's as the fit starts (``RunPlan``; docs/benchmarks.md,
"Start-up").

The parts, each ending at its mark: ``imports`` (the interpreter, torch, Lightning, the project's modules, until the
command's ``TemplateCLI`` starts), ``engine`` (the engine's own part: parse, facts, checks, run directory, checkpoint
resolution), ``model and data`` (their constructors), ``Trainer`` (callbacks, strategy, plugins, the Trainer), ``setup``
(``trainer.fit`` to ``on_fit_start``: process group, the data module's ``prepare_data`` and ``setup``, device placement,
where CUDA initialises on a GPU, a resumed checkpoint's restore, the model summary), ``sanity check`` (validation before
training, where it runs), ``first batch`` (the training loader built, its iterator started, workers included, the first
fetch), ``first step`` (forward, backward, optimizer; compilation with ``--compile=true``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: the command's marks so far: the name of the part each ends, and when (``time.perf_counter``)
_marks: list[tuple[str, float]] = []


def process_started() -> float | None:
    """When this process started, on ``time.perf_counter``'s clock (Linux); None where that is unknown."""
    try:
        # after the command's name (field 2, which may hold spaces), fields count from 3: starttime is 22
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[22 - 3])
        # the boot clock, not /proc/stat's btime, which is in whole seconds
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.perf_counter() - age


def command_started() -> None:
    """The command line's start: the imports end here, and an earlier command's marks are forgotten."""
    _marks.clear()
    mark("imports")


def mark(part: str) -> None:
    """End the part named ``part`` now."""
    _marks.append((part, time.perf_counter()))


def taken() -> list[tuple[str, float]]:
    """The command's marks, handed over once (a later fit in the same process starts from its own)."""
    marks = list(_marks)
    _marks.clear()
    return marks


def split(marks: list[tuple[str, float]], started: float | None) -> dict[str, float]:
    """Each part's seconds and their ``total``, from ``started`` (else from the first mark, which then names no
    part) to the last mark."""
    if started is None:
        started, marks = marks[0][1], marks[1:]
    parts, previous = {}, started
    for name, at in marks:
        parts[name] = at - previous
        previous = at
    return {**parts, "total": previous - started}


def line(parts: dict[str, float]) -> str:
    """One line: ``first step after T s: imports x, engine y, ...``."""
    each = ", ".join(f"{name} {seconds:.2f}" for name, seconds in parts.items() if name != "total")
    return f"first step after {parts['total']:.2f} s: {each}"
