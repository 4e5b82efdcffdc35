"""The measured pipeline bubble (``StageClock`` in benchmarks/clock.py, ``bubble_figures`` in benchmarks/stats.py)
on real timings: threads play the stages of a GPipe schedule, each forward and backward of a micro-batch a real
sleep, the micro-batches and their gradients handed on through queues. For stages of equal time the share each
waited is the theory's, ``(stages - 1) / (micro_batches + stages - 1)``."""

from __future__ import annotations

import csv
import queue
import statistics
import threading
import time

import pytest
import torch

from benchmarks.clock import StageClock
from benchmarks.report import build_table, markdown, write_all
from benchmarks.runner import Row
from benchmarks.stats import bubble_figures
from benchmarks.timing import time_stage_work
from multigpu.strategies.pipeline import PipelineOptions, bubble_fraction
from tests.benchmarks.test_bench import _run, environment

WORK_S = 0.02  # one stage's forward (or backward) of one micro-batch
STEPS = 3  # the first is not timed (StageClock.result starts at the second step, as the step times do)


def play_gpipe(stages: int, micro_batches: int) -> list[dict]:
    """Each stage in a thread: all forwards, then all backwards, waiting for its neighbours; the step ends when every
    stage is done (as the template's sums over the stages make it). Returns what each stage's clock measured."""
    activations = [queue.Queue() for _ in range(stages)]  # into stage i
    gradients = [queue.Queue() for _ in range(stages)]  # into stage i, from stage i + 1
    done = threading.Barrier(stages)
    clocks = [StageClock(torch.device("cpu")) for _ in range(stages)]

    def work(clock: StageClock) -> None:
        clock.work_start()
        time.sleep(WORK_S)
        clock.work_end()

    def stage(index: int) -> None:
        clock = clocks[index]
        for _ in range(STEPS):
            clock.window_start()
            for _ in range(micro_batches):
                if index > 0:
                    activations[index].get()
                work(clock)
                if index < stages - 1:
                    activations[index + 1].put(None)
            for _ in range(micro_batches):
                if index < stages - 1:
                    gradients[index].get()
                work(clock)
                if index > 0:
                    gradients[index - 1].put(None)
            done.wait()
            clock.window_end()
            clock.step_end()

    threads = [threading.Thread(target=stage, args=(index,)) for index in range(stages)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return [{**clock.result(), "pipeline_stage": index} for index, clock in enumerate(clocks)]


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 4), (3, 2)])
def test_the_measured_bubble_of_equal_stages_is_the_theorys(stages, micro_batches):
    ranks = play_gpipe(stages, micro_batches)
    timed = [True] * (STEPS - 1)
    for rank in ranks:  # every timed step: the window, and the stage's 2 x micro_batches pieces of work in it
        assert len(rank["pipeline_window_s"]) == len(rank["pipeline_work_s"]) == STEPS - 1
        for window, work in zip(rank["pipeline_window_s"], rank["pipeline_work_s"], strict=True):
            assert work >= 2 * micro_batches * WORK_S and window > work
    figures = bubble_figures(ranks, timed)
    theory = bubble_fraction(stages, micro_batches)
    assert figures["bubble_measured"] == pytest.approx(theory, abs=0.05)
    assert figures["bubble_p25"] <= figures["bubble_measured"] <= figures["bubble_p75"]
    assert figures["bubble_per_stage"] == pytest.approx([theory] * stages, abs=0.05)
    # a step left out of the timed ones (a warm-up step, an epoch boundary) is left out of the figures
    assert bubble_figures(ranks, [True, False])["bubble_measured"] == pytest.approx(
        sum(1 - r["pipeline_work_s"][0] / r["pipeline_window_s"][0] for r in ranks) / stages
    )
    assert bubble_figures([{"step_times_s": [0.1]}], [True]) == {}  # not a pipeline run: no figures


def test_work_outside_the_window_is_not_counted():
    clock = StageClock(torch.device("cpu"))
    clock.work_start()  # the first step builds the stages: not timed
    clock.work_end()
    clock.step_end()
    clock.window_start()
    clock.work_start()
    time.sleep(0.01)
    clock.work_end()
    clock.window_start()  # a second batch of the same optimizer step (accumulation) keeps the window open
    clock.window_end()
    clock.work_start()  # after the window closed (the optimizer step): not the stage's pipelined work
    clock.work_end()
    clock.step_end()
    (window,), (work,) = clock.result().values()
    assert 0.01 <= work <= window


def test_the_report_puts_the_measured_bubble_beside_the_theorys(tmp_path):
    measured = [bubble_figures(play_gpipe(2, 4), [True] * (STEPS - 1)) for _ in range(2)]  # two repeats
    runs = [{**_run(40.0, 2.0), **figures} for figures in measured]
    row = Row("gpt", "pipeline", 2, "32-true", 16)
    table = build_table({Row("gpt", "single", 1, "32-true", 16): [_run(30.0, 2.0)], row: runs}, "cpu", {"gpt": {}}, {})
    entry = table[1]
    theory = bubble_fraction(2, PipelineOptions().micro_batches)
    assert entry["bubble_theory"] == theory and (entry["pipeline_stages"], entry["micro_batches"]) == (2, 4)
    assert entry["bubble_measured"] == statistics.median(figures["bubble_measured"] for figures in measured)
    assert entry["bubble_measured_min"] <= entry["bubble_measured"] <= entry["bubble_measured_max"]
    assert table[0]["bubble_theory"] is None and table[0]["bubble_measured"] is None
    results = {
        "environment": environment("python -m benchmarks --strategies single,pipeline"),
        "settings": {"accelerator": "cpu", "threads": 1, "warmup": 1, "steps": 4, "repeats": 2, "quick": True},
        "rows": table,
    }
    report = markdown(results)
    section = report.split("## Pipeline bubble")[1]
    pct = [f"{100 * entry[key]:.0f}%" for key in ("bubble_measured", "bubble_measured_min", "bubble_measured_max")]
    assert f"template, pipeline (layers in stages, 1f1b) x2: theory {100 * theory:.0f}% (2 stages, 4" in section
    assert f"; measured {pct[0]} [" in section and f"2 repeats from {pct[1]} to {pct[2]}" in section
    assert "stage 0 " in section and "stage 1 " in section and "single" not in section
    write_all(tmp_path, results, plots=False)
    written = {r["strategy"]: r for r in csv.DictReader((tmp_path / "results.csv").read_text().splitlines())}
    assert float(written["pipeline"]["bubble_measured"]) == entry["bubble_measured"]


class Stage:
    """Test-only: a stage's three pieces of work, each recorded; the backward fails."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def forward_one_chunk(self, chunk: int) -> int:
        self.events.append(f"forward {chunk}")
        return chunk

    def backward_one_chunk(self, chunk: int) -> None:
        raise RuntimeError("backward failed")

    def backward_weight_one_chunk(self, chunk: int) -> None:
        self.events.append(f"weights {chunk}")


def test_time_stage_work_brackets_each_piece_of_work_a_failing_one_too():
    events: list[str] = []
    stage = Stage(events)
    time_stage_work(stage, lambda: events.append("start"), lambda: events.append("end"))
    assert stage.forward_one_chunk(3) == 3
    stage.backward_weight_one_chunk(1)
    with pytest.raises(RuntimeError, match="backward failed"):
        stage.backward_one_chunk(0)
    assert events == ["start", "forward 3", "end", "start", "weights 1", "end", "start", "end"]
