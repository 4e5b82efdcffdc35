"""Per-step wall times of one training process, written as JSON (used by ``StepTimer`` and the plain baselines).

A step's time is the interval between the ends of two consecutive optimizer steps, so everything the loop does
per step counts (loading, transfer, augmentation, forward, backward, optimizer, logging, progress output,
callbacks), wherever in the loop it happens. The main thread's CPU time per step is kept beside it: on a
machine shared with other jobs it shows the work a step costs, where the wall time also holds the waiting. On a
GPU the step ends are CUDA events read after training, so no host synchronisation is added inside the timed
window. Peak memory is the template's own probe, the one every training run logs (``peak_memory`` of
``multigpu/observe/throughput.py``). Each process writes its own file (``rank_path``); the launcher reads them all.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

#: the launcher's ``time.time()`` just before it started the run, for the time to first step
T0_ENV = "BENCH_T0"


def rank_path(path: str | Path, rank: int) -> Path:
    """``out.json`` for rank 0, ``out.rank1.json`` ... for the others."""
    path = Path(path)
    return path if rank == 0 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def launch_time() -> float | None:
    value = os.environ.get(T0_ENV)
    return float(value) if value else None


class StepClock:
    """Records the end of every optimizer step of one process and summarises the run as a dict."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.t0 = launch_time()
        self.host_ends: list[float] = []
        self.cpu_ends: list[float] = []
        self.events: list[Any] = []
        self.new_epoch: list[bool] = []
        self.first_step_s: float | None = None
        self.losses: dict[str, float] = {}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def step_end(self, new_epoch: bool = False) -> None:
        """Call at the end of each optimizer step; ``new_epoch``: this step started a new pass over the data."""
        if self.first_step_s is None and self.t0 is not None:
            if self.cuda:
                torch.cuda.synchronize(self.device)  # once, outside the timed window: the step really finished
            self.first_step_s = time.time() - self.t0
        self.host_ends.append(time.perf_counter())
        self.cpu_ends.append(time.thread_time())
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        self.new_epoch.append(new_epoch)

    def record_loss(self, name: str, loss: torch.Tensor | float) -> None:
        """Keep a loss value (first and last step) to check that two runs trained the same thing."""
        self.losses[name] = float(loss.detach().float().item() if isinstance(loss, torch.Tensor) else loss)

    @property
    def steps(self) -> int:
        return len(self.host_ends)

    def step_times(self) -> list[float]:
        """Seconds between consecutive step ends; entry ``i`` is the time of step ``i + 1`` (0-based)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return [start.elapsed_time(end) / 1000 for start, end in zip(self.events, self.events[1:], strict=False)]
        return [end - start for start, end in zip(self.host_ends, self.host_ends[1:], strict=False)]

    def cpu_times(self) -> list[float]:
        """CPU seconds the calling thread spent per step: unlike wall time, not inflated by other jobs on the cores."""
        return [end - start for start, end in zip(self.cpu_ends, self.cpu_ends[1:], strict=False)]

    def result(self, **extra: Any) -> dict[str, Any]:
        # the template's own probe, as every training run logs it (imported here: it imports Lightning, which the
        # launcher of plain DDP does not need)
        from multigpu.observe.throughput import peak_memory

        return {
            "step_times_s": self.step_times(),
            "cpu_times_s": self.cpu_times(),
            "new_epoch": self.new_epoch[1:],
            "steps": self.steps,
            "first_step_s": self.first_step_s,
            "peak_memory": peak_memory(self.device),
            "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(self.device) if self.cuda else "cpu",
            "losses": self.losses,
            "pid": os.getpid(),
            **extra,
        }

    def write(self, path: str | Path, rank: int, **extra: Any) -> Path:
        target = rank_path(path, rank)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.result(rank=rank, **extra)))
        return target


class StageClock:
    """The pipelined part of each optimizer step of one pipeline rank, and the time its stage worked in it.

    The window opens when the step's first batch starts and closes before the optimizer step: it holds the
    schedule's forwards and backwards of every micro-batch and the sums over the stages that follow them (the
    loss, tied weights), where a stage that finished early waits for the others. The work is each call of the
    stage's forward or backward of one micro-batch (``benchmarks.timing.time_stage_work``); the rest of the window the
    stage waited for its neighbours: the bubble (``benchmarks.stats.bubble_figures``). On a GPU every mark is a
    CUDA event on the stage's stream, read after training, so the kernels' time counts and no sync is added.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._window: list[Any] = []
        self._work: list[tuple[Any, Any]] = []
        self._work_start: Any = None
        #: per optimizer step: (window start, window end, [(work start, work end), ...]), None before timing began
        self.marks: list[tuple[Any, Any, list[tuple[Any, Any]]] | None] = []

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def window_start(self) -> None:
        """At the start of each batch: opens the step's window at its first batch (accumulation: later ones keep it)."""
        if not self._window:
            self._window.append(self._mark())

    def window_end(self) -> None:
        """Before the optimizer step."""
        if len(self._window) == 1:
            self._window.append(self._mark())

    def work_start(self) -> None:
        self._work_start = self._mark()

    def work_end(self) -> None:
        if self._work_start is not None and len(self._window) == 1:  # work inside the open window only
            self._work.append((self._work_start, self._mark()))
        self._work_start = None

    def step_end(self) -> None:
        """At the end of each optimizer step (the same calls as ``StepClock.step_end``)."""
        complete = len(self._window) == 2
        self.marks.append((self._window[0], self._window[1], self._work) if complete else None)
        self._window, self._work = [], []

    def _seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000 if self.cuda else end - start

    def result(self) -> dict[str, list[float | None]]:
        """Per optimizer step, aligned with ``StepClock.result()["step_times_s"]`` (which starts at the second
        step): the window's and the work's seconds, None where the step was not timed."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        window: list[float | None] = []
        work: list[float | None] = []
        for marks in self.marks[1:]:
            window.append(None if marks is None else self._seconds(marks[0], marks[1]))
            work.append(None if marks is None else sum(self._seconds(start, end) for start, end in marks[2]))
        return {"pipeline_window_s": window, "pipeline_work_s": work}
