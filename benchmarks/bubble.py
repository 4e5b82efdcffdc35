"""The measure of the pipeline bubble (``StageClock`` in benchmarks/clock.py, ``bubble_figures`` in
benchmarks/stats.py) on a GPipe schedule of stages of equal time, against the theory's
``(stages - 1) / (micro_batches + stages - 1)``.

``python -m benchmarks.bubble [--repeats 7] [--work_ms 20]`` from the repository root: threads play the stages, each
forward and backward of a micro-batch a real sleep, the micro-batches and their gradients handed on through queues;
prints, per shape, the median of the repeats' measured bubble and their range beside the theory. A busy machine
wakes the threads late and raises the figure: it is a measurement, read as one. The tests play the same schedule on
a logical clock, where the measure must give the theory exactly (tests/benchmarks/test_bubble.py).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from typing import Any

import torch

from benchmarks.clock import StageClock
from benchmarks.stats import bubble_figures
from multigpu.strategies.pipeline import bubble_fraction

STEPS = 3  # the first is not timed (StageClock.result starts at the second step, as the step times do)
#: the shapes (stages, micro-batches) played by default
SHAPES = ((2, 4), (3, 2))


class RealTime:
    """The schedule in real time: each piece of work sleeps ``work_s``; a hand-over carries nothing."""

    def __init__(self, work_s: float = 0.02) -> None:
        self.work_s = work_s

    def work(self) -> None:
        time.sleep(self.work_s)

    def send(self) -> Any:
        return None

    def receive(self, sent: Any) -> None:
        pass

    def finish(self, index: int, done: threading.Barrier) -> None:
        """The step ends when every stage is done (as the template's sums over the stages make it)."""
        done.wait()


def play_gpipe(stages: int, micro_batches: int, timeline: Any | None = None, steps: int = STEPS) -> list[dict]:
    """Each stage in a thread: all forwards, then all backwards, waiting for its neighbours; the step ends when every
    stage is done. ``timeline`` says what a piece of work, a hand-over and the step's end cost (default: real sleeps,
    ``RealTime``). Returns what each stage's clock measured, with its ``pipeline_stage``."""
    timeline = timeline or RealTime()
    activations = [queue.Queue() for _ in range(stages)]  # into stage i
    gradients = [queue.Queue() for _ in range(stages)]  # into stage i, from stage i + 1
    done = threading.Barrier(stages)
    clocks = [StageClock(torch.device("cpu")) for _ in range(stages)]

    def work(clock: StageClock) -> None:
        clock.work_start()
        timeline.work()
        clock.work_end()

    def stage(index: int) -> None:
        clock = clocks[index]
        for _ in range(steps):
            clock.window_start()
            for _ in range(micro_batches):
                if index > 0:
                    timeline.receive(activations[index].get())
                work(clock)
                if index < stages - 1:
                    activations[index + 1].put(timeline.send())
            for _ in range(micro_batches):
                if index < stages - 1:
                    timeline.receive(gradients[index].get())
                work(clock)
                if index > 0:
                    gradients[index - 1].put(timeline.send())
            timeline.finish(index, done)
            clock.window_end()
            clock.step_end()

    threads = [threading.Thread(target=stage, args=(index,)) for index in range(stages)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return [{**clock.result(), "pipeline_stage": index} for index, clock in enumerate(clocks)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--work_ms", type=float, default=20.0, help="one stage's forward (or backward) of a batch")
    options = parser.parse_args(argv)
    for stages, micro_batches in SHAPES:
        measured = [
            bubble_figures(play_gpipe(stages, micro_batches, RealTime(options.work_ms / 1000)), [True] * (STEPS - 1))
            for _ in range(options.repeats)
        ]
        values = [figures["bubble_measured"] for figures in measured]
        print(
            f"{stages} stages, {micro_batches} micro-batches: theory {bubble_fraction(stages, micro_batches):.3f},"
            f" measured {statistics.median(values):.3f} (median of {len(values)}, {min(values):.3f} to"
            f" {max(values):.3f})"
        )


if __name__ == "__main__":
    main()
