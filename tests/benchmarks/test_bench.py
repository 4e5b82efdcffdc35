"""The strategy benchmark: its figures and its plan (its built-in workloads, the examples, are run by
tests/examples/test_bench_workloads.py)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks.__main__ import plan
from benchmarks.report import build_table, markdown, write_all
from benchmarks.runner import Row
from benchmarks.stats import scaling_efficiency, summarise_run


def test_summary_leaves_out_warm_up_and_epoch_boundaries():
    rank = {
        "step_times_s": [9.0, 0.010, 0.012, 5.0, 0.011],  # steps 2..6; step 5 began a new epoch
        "new_epoch": [False, False, False, True, False],
        "cpu_times_s": [9.0, 0.010, 0.010, 5.0, 0.010],
        "steps": 6,
        "first_step_s": 3.0,
        "peak_memory": {"perf/memory_rss_gb": 0.25},  # what src.callbacks.throughput.peak_memory returns on a CPU
        "threads": 1,
        "device": "cpu",
    }
    other = {**rank, "first_step_s": 3.5, "peak_memory": {"perf/memory_rss_gb": 0.5}}
    figures = summarise_run([rank, other], warmup=2, global_batch=32)
    assert figures["timed_steps"] == 3 and figures["epoch_boundaries_excluded"] == 1
    assert figures["step_ms_median"] == pytest.approx(11.0)
    assert figures["samples_per_s"] == pytest.approx(32 / 0.011)
    assert figures["startup_s"] == 3.5  # the slowest rank
    assert (figures["step_ms_p25"], figures["step_ms_p75"]) == pytest.approx((10.5, 11.5))  # as numpy's default
    assert figures["peak_memory_mb"] == pytest.approx(500.0) and figures["memory_kind"] == "perf/memory_rss_gb"
    assert scaling_efficiency(150.0, 2, 100.0) == pytest.approx(0.75)


def test_every_table_shows_the_template_beside_bare_lightning_and_plain_pytorch():
    args = argparse.Namespace(
        quick=True, workload=["image"], strategies=["ddp"], devices=[2], precisions=None, batch_sizes=[8]
    )
    rows, _ = plan(args, "cpu", {"image": 32}, workloads=["image"])  # the plan only: nothing is built
    assert {(r.strategy, r.processes) for r in rows} == {
        ("single", 1),
        ("bare-lightning", 1),
        ("plain-loop", 1),
        ("ddp", 2),
        ("bare-lightning-ddp", 2),
        ("plain-ddp", 2),
    }
    with pytest.raises(SystemExit, match="Fix: choose from"):
        plan(argparse.Namespace(**{**vars(args), "strategies": ["dpp"]}), "cpu", {"image": 32}, workloads=["image"])


def test_fsdp2_rows_run_only_when_named():
    args = argparse.Namespace(
        quick=True, workload=["image"], strategies=None, devices=[2], precisions=None, batch_sizes=[8]
    )
    every = {r.strategy for r in plan(args, "cpu", {"image": 32}, workloads=["image"])[0]}
    assert "ddp" in every and "fsdp2" not in every  # for models that do not fit one device: not in "all"
    args.strategies = ["fsdp2"]
    named = {(r.strategy, r.processes) for r in plan(args, "cpu", {"image": 32}, workloads=["image"])[0]}
    assert ("fsdp2", 2) in named and ("plain-ddp", 2) in named  # beside the baselines it is compared with


def _run(step_ms: float, loss: float) -> dict:
    return {
        "step_ms_mean": step_ms,
        "step_ms_median": step_ms,
        "step_ms_p25": step_ms,
        "step_ms_p75": step_ms,
        "cpu_ms_mean": step_ms,
        "cpu_share": 1.0,
        "samples_per_s": 8000 / step_ms,
        "startup_s": 4.0,
        "peak_memory_mb": 500.0,
        "memory_kind": "perf/memory_rss_gb",
        "threads_per_process": [1],
        "processes": 1,
        "device": "cpu",
        "strategy_class": "x",
        "precision_run": "32-true",
        "loss_first": loss,
        "loss_last": loss,
    }


def test_report_splits_the_overhead_into_lightnings_and_the_templates(tmp_path):
    rows = {
        Row("image", "single", 1, "32-true", 8): [_run(7.5, 2.0)],
        Row("image", "bare-lightning", 1, "32-true", 8): [_run(7.0, 2.0)],
        Row("image", "plain-loop", 1, "32-true", 8): [_run(6.0, 2.0)],
        Row("image", "ddp", 2, "32-true", 8): [_run(4.0, 2.0)],
        Row("image", "bare-lightning-ddp", 2, "32-true", 8): [_run(4.2, 2.0)],
        Row("image", "plain-ddp", 2, "32-true", 8): [_run(3.9, 2.0)],
    }
    table = build_table(rows, "cpu", {"image": {}}, {})
    template, bare, plain, ddp = table[:4]
    assert template["overhead_ms_per_step"] == pytest.approx(1.5)  # Lightning's and the template's
    assert template["overhead_vs_bare_ms_per_step"] == pytest.approx(0.5)  # the template's own
    assert bare["overhead_ms_per_step"] == pytest.approx(1.0)  # Lightning's own
    assert bare["overhead_vs_bare_ms_per_step"] is None and plain["overhead_ms_per_step"] is None
    assert template["same_loss_as_bare"] and template["same_loss_as_plain"]
    results = {
        "environment": {
            "command": "python -m benchmarks --quick",
            "cpu": "cpu",
            "cpu_cores": 2,
            "cpu_cores_usable": 2,
            "memory_gib": 1,
            "gpus": [],
            "python": "3",
            "torch": "2",
            "lightning": "2",
            "torchmetrics": "1",
            "git_commit": None,
            "git_dirty": None,
            "load_average_start": None,
        },
        "settings": {"accelerator": "cpu", "threads": 1, "warmup": 1, "steps": 4, "repeats": 1, "quick": True},
        "rows": table,
        "startup": {"cli_help_s": 3.0, "import_lightning_s": 2.5, "help_vs_import": 1.2, "repeats": 3},
    }
    report = markdown(results)
    assert "image 32-true b8 template, 1 device x1: the template over bare Lightning +0.50 ms/step (+7.1%" in report
    assert "the template's loop over the plain loop +1.50 ms/step (+25.0%" in report
    assert "`--help` over the import: 1.20x" in report and "peak resident set of each process" in report
    assert "97.5% of plain DDP's throughput; scaling efficiency 94% vs plain DDP's 77%" in report
    assert ddp["bare_key"] == "image-bare-lightning-ddp-2dev-32-true-b8" and ddp["per_process_batch"] == 4
    assert "target" not in report.lower()  # the project's targets are stated in docs/benchmarks.md, not here

    written = write_all(tmp_path, results)  # the JSON, CSV, report and both plots (matplotlib: a dev dependency)
    assert [path.name for path in written] == [
        "results.json",
        "results.csv",
        "results.md",
        "throughput_vs_devices.png",
        "lightning_vs_plain.png",
    ]
    assert all(path.read_bytes()[:4] == b"\x89PNG" for path in written[3:])
    assert json.loads(written[0].read_text())["rows"][3]["key"] == "image-ddp-2dev-32-true-b8"
