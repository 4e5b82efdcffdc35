"""The measure of the pipeline bubble (``StageClock`` in benchmarks/clock.py, ``bubble_figures`` in
benchmarks/stats.py) on a GPipe schedule played by threads (``benchmarks.bubble.play_gpipe``), the micro-batches and
their gradients handed on through queues, on a logical clock: each forward and backward of a micro-batch is one unit
of a stage's time, so that for stages of equal time the share each waited is the theory's,
``(stages - 1) / (micro_batches + stages - 1)``, exactly and whatever the machine's load. The same schedule in real
time (sleeps) is a benchmark: ``python -m benchmarks.bubble`` prints its median and spread."""

from __future__ import annotations

import csv
import statistics
import threading
import types

import pytest
import torch

import benchmarks.clock
from benchmarks.bubble import STEPS, main, play_gpipe
from benchmarks.clock import StageClock
from benchmarks.report import build_table, markdown, write_all
from benchmarks.runner import Row
from benchmarks.stats import bubble_figures
from benchmarks.timing import time_stage_work
from multigpu.strategies.pipeline import PipelineOptions, bubble_fraction
from tests.benchmarks.test_bench import _run, environment


class LogicalTime:
    """Each stage's own clock, counted in pieces of work: a forward or backward of one micro-batch takes one unit, a
    hand-over none (the receiver's clock moves on to the sender's time of sending, if it is behind), and the step
    ends on every stage at the time of the last one to finish."""

    def __init__(self, stages: int) -> None:
        self.local = threading.local()
        self.ends = [0.0] * stages

    def now(self) -> float:
        return getattr(self.local, "time", 0.0)

    def work(self) -> None:
        self.local.time = self.now() + 1

    def send(self) -> float:
        return self.now()

    def receive(self, sent: float) -> None:
        self.local.time = max(self.now(), sent)

    def finish(self, index: int, done: threading.Barrier) -> None:
        self.ends[index] = self.now()
        done.wait()
        self.local.time = max(self.ends)
        done.wait()  # every stage has read the ends before one writes its next


@pytest.fixture
def logical_gpipe(monkeypatch: pytest.MonkeyPatch):
    """``play_gpipe`` on a ``LogicalTime``, which the stages' clocks read in place of ``time.perf_counter``."""

    def play(stages: int, micro_batches: int) -> list[dict]:
        timeline = LogicalTime(stages)
        monkeypatch.setattr(benchmarks.clock, "time", types.SimpleNamespace(perf_counter=timeline.now))
        return play_gpipe(stages, micro_batches, timeline)

    return play


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 4), (3, 2)])
def test_the_measured_bubble_of_equal_stages_is_the_theorys(stages, micro_batches, logical_gpipe):
    ranks = logical_gpipe(stages, micro_batches)
    timed = [True] * (STEPS - 1)
    for rank in ranks:  # every timed step: the window, and the stage's 2 x micro_batches pieces of work in it
        assert len(rank["pipeline_window_s"]) == len(rank["pipeline_work_s"]) == STEPS - 1
        for window, work in zip(rank["pipeline_window_s"], rank["pipeline_work_s"], strict=True):
            # the fill and the drain: every stage's window holds 2 x (micro_batches + stages - 1) pieces' time
            assert (work, window) == (2 * micro_batches, 2 * (micro_batches + stages - 1))
    figures = bubble_figures(ranks, timed)
    theory = bubble_fraction(stages, micro_batches)
    assert figures["bubble_measured"] == pytest.approx(theory)
    assert figures["bubble_p25"] <= figures["bubble_measured"] <= figures["bubble_p75"]
    assert figures["bubble_per_stage"] == pytest.approx([theory] * stages)
    # a step left out of the timed ones (a warm-up step, an epoch boundary) is left out of the figures
    assert bubble_figures(ranks, [True, False])["bubble_measured"] == pytest.approx(
        sum(1 - r["pipeline_work_s"][0] / r["pipeline_window_s"][0] for r in ranks) / stages
    )
    assert bubble_figures([{"step_times_s": [0.1]}], [True]) == {}  # not a pipeline run: no figures


def test_the_benchmark_plays_each_shape_in_real_time_and_prints_its_median_beside_the_theory(capsys):
    main(["--repeats=2", "--work_ms=1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["2 stages, 4 micro-batches", "3 stages, 2 micro-batches"]
    assert "theory 0.200, measured " in lines[0] and "theory 0.500, measured " in lines[1]
    assert all("(median of 2, " in line for line in lines)


def test_work_outside_the_window_is_not_counted(monkeypatch):
    now = [0.0]  # the clock the stage reads, moved by the test

    def elapse(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(benchmarks.clock, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    clock = StageClock(torch.device("cpu"))
    clock.work_start()  # the first step builds the stages: not timed
    elapse(5)
    clock.work_end()
    clock.step_end()
    clock.window_start()
    elapse(1)
    clock.work_start()
    elapse(2)
    clock.work_end()
    clock.window_start()  # a second batch of the same optimizer step (accumulation) keeps the window open
    elapse(1)
    clock.window_end()
    clock.work_start()  # after the window closed (the optimizer step): not the stage's pipelined work
    elapse(8)
    clock.work_end()
    clock.step_end()
    (window,), (work,) = clock.result().values()
    assert work <= window and (work, window) == (2, 4)  # the work inside the window; the window from its first batch


def test_the_report_puts_the_measured_bubble_beside_the_theorys(tmp_path, logical_gpipe):
    measured = [bubble_figures(logical_gpipe(2, 4), [True] * (STEPS - 1)) for _ in range(2)]  # two repeats
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
