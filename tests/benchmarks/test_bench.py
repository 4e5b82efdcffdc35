"""The strategy benchmark: its figures and its plan (its built-in workloads, the examples, are run by
tests/examples/test_bench_workloads.py)."""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import replace

import pytest

from benchmarks.__main__ import entry, plan
from benchmarks.report import build_table, markdown, write_all
from benchmarks.runner import Row, not_applicable
from benchmarks.stats import aggregate, scaling_efficiency, summarise_run
from benchmarks.workloads import WORKLOADS


def environment(command: str) -> dict:
    """The machine section of a results file, as the benchmark writes it, with placeholder values."""
    return {
        "command": command,
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
    }


def test_summary_leaves_out_warm_up_and_epoch_boundaries():
    rank = {
        "step_times_s": [9.0, 0.010, 0.012, 5.0, 0.011],  # steps 2..6; step 5 began a new epoch
        "new_epoch": [False, False, False, True, False],
        "cpu_times_s": [9.0, 0.010, 0.010, 5.0, 0.010],
        "steps": 6,
        "first_step_s": 3.0,
        "peak_memory": {"perf/memory_rss_gb": 0.25},  # what multigpu.observe.throughput.peak_memory returns on a CPU
        "threads": 1,
        "device": "cpu",
    }
    rank["state_bytes"] = {"parameters": 1_000_000, "gradients": 1_000_000, "optimizer_state": 2_000_000}
    other = {
        **rank,
        "first_step_s": 3.5,
        "peak_memory": {"perf/memory_rss_gb": 0.5},
        # an uneven split: rank 1 holds more of the shards
        "state_bytes": {"parameters": 1_500_000, "gradients": 1_500_000, "optimizer_state": 3_000_000},
    }
    figures = summarise_run([rank, other], warmup=2, global_batch=32)
    assert figures["timed_steps"] == 3 and figures["epoch_boundaries_excluded"] == 1
    assert figures["step_ms_median"] == pytest.approx(11.0)
    assert figures["samples_per_s"] == pytest.approx(32 / 0.011)
    assert figures["startup_s"] == 3.5  # the slowest rank
    assert (figures["step_ms_p25"], figures["step_ms_p75"]) == pytest.approx((10.5, 11.5))  # as numpy's default
    assert figures["peak_memory_mb"] == pytest.approx(500.0) and figures["memory_kind"] == "perf/memory_rss_gb"
    assert figures["state_mb_per_rank"] == pytest.approx(6.0)  # the fullest rank: 1.5 + 1.5 + 3 MB
    assert (figures["parameters_mb_per_rank"], figures["optimizer_state_mb_per_rank"]) == pytest.approx((1.5, 3.0))
    assert aggregate([figures, {**figures, "samples_per_s": 1.0}])["state_mb_per_rank"] == pytest.approx(6.0)
    assert scaling_efficiency(150.0, 2, 100.0) == pytest.approx(0.75)
    unknown = summarise_run([{k: v for k, v in rank.items() if k != "state_bytes"}], warmup=2, global_batch=32)
    assert unknown["state_mb_per_rank"] is None  # a run that did not count them: no figure, not 0


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


def test_model_parallel_rows_run_only_when_named():
    args = argparse.Namespace(
        quick=True, workload=["image"], strategies=None, devices=[2], precisions=None, batch_sizes=[8]
    )
    every = {r.strategy for r in plan(args, "cpu", {"image": 32}, workloads=["image"])[0]}
    assert "ddp" in every and not {"fsdp2", "tensor_parallel"} & every  # for models that do not fit one device
    args.strategies = ["fsdp2", "tensor_parallel"]
    named = {(r.strategy, r.processes) for r in plan(args, "cpu", {"image": 32}, workloads=["image"])[0]}
    assert {("fsdp2", 2), ("tensor_parallel", 2), ("plain-ddp", 2)} <= named  # beside the baselines


def test_tensor_parallel_row_is_refused_for_a_model_without_a_plan():
    row = Row("image", "tensor_parallel", 2, "32-true", 8)
    image = replace(WORKLOADS["image"], model_name="ImageClassifier", tensor_parallel_plan=False)
    reason = not_applicable(row, image)
    assert reason == (
        "n/a: ImageClassifier has no configure_model hook, so no tensor-parallel plan (fsdp2 shards any model)"
    )
    assert not_applicable(row, replace(image, tensor_parallel_plan=True)) is None
    assert not_applicable(replace(row, strategy="fsdp2"), image) is None  # fsdp2 needs no plan


def test_a_budget_that_is_not_positive_is_refused(capsys):
    assert entry(["--workload", "gpt", "--memory-budget-mb", "0"]) == 2  # before anything is built or run
    assert "--memory-budget-mb 0 is not a budget. Fix: give a positive number of MB." in capsys.readouterr().err


def _run(step_ms: float, loss: float, state_mb: float | None = 1.0) -> dict:
    return {
        "state_mb_per_rank": state_mb,
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


def _quick_results() -> dict:
    """The results of a quick benchmark: the template, bare Lightning and plain PyTorch, one device and ddp."""
    rows = {
        Row("image", "single", 1, "32-true", 8): [_run(7.5, 2.0)],
        Row("image", "bare-lightning", 1, "32-true", 8): [_run(7.0, 2.0)],
        Row("image", "plain-loop", 1, "32-true", 8): [_run(6.0, 2.0)],
        Row("image", "ddp", 2, "32-true", 8): [_run(4.0, 2.0)],
        Row("image", "bare-lightning-ddp", 2, "32-true", 8): [_run(4.2, 2.0)],
        Row("image", "plain-ddp", 2, "32-true", 8): [_run(3.9, 2.0)],
    }
    return {
        "environment": environment("python -m benchmarks --quick"),
        "settings": {"accelerator": "cpu", "threads": 1, "warmup": 1, "steps": 4, "repeats": 1, "quick": True},
        "rows": build_table(rows, "cpu", {"image": {}}, {}),
        "startup": {"cli_help_s": 3.0, "import_lightning_s": 2.5, "help_vs_import": 1.2, "repeats": 3},
    }


def test_report_splits_the_overhead_into_lightnings_and_the_templates(tmp_path):
    results = _quick_results()
    template, bare, plain, ddp = results["rows"][:4]
    assert template["overhead_ms_per_step"] == pytest.approx(1.5)  # Lightning's and the template's
    assert template["overhead_vs_bare_ms_per_step"] == pytest.approx(0.5)  # the template's own
    assert bare["overhead_ms_per_step"] == pytest.approx(1.0)  # Lightning's own
    assert bare["overhead_vs_bare_ms_per_step"] is None and plain["overhead_ms_per_step"] is None
    assert template["same_loss_as_bare"] and template["same_loss_as_plain"]
    report = markdown(results)
    assert "image 32-true b8 template, 1 device x1: the template over bare Lightning +0.50 ms/step (+7.1%" in report
    assert "the template's loop over the plain loop +1.50 ms/step (+25.0%" in report
    assert "`--help` over the import: 1.20x" in report and "peak resident set of each process" in report
    assert "97.5% of plain DDP's throughput; scaling efficiency 94% vs plain DDP's 77%" in report
    assert ddp["bare_key"] == "image-bare-lightning-ddp-2dev-32-true-b8" and ddp["per_process_batch"] == 4
    assert "target" not in report.lower()  # the project's targets are stated in docs/benchmarks.md, not here

    written = write_all(tmp_path, results, plots=False)  # the plots: the next test
    assert [path.name for path in written] == ["results.json", "results.csv", "results.md"]
    assert json.loads(written[0].read_text())["rows"][3]["key"] == "image-ddp-2dev-32-true-b8"


def test_the_results_are_written_with_both_plots(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib: pip install -e .[bench]")
    written = write_all(tmp_path, _quick_results())
    assert [path.name for path in written] == [
        "results.json",
        "results.csv",
        "results.md",
        "throughput_vs_devices.png",
        "lightning_vs_plain.png",
    ]
    assert all(path.read_bytes()[:4] == b"\x89PNG" for path in written[3:])


def test_rows_over_the_memory_budget_are_marked_in_the_table_report_and_csv(tmp_path):
    rows = {
        Row("gpt", "single", 1, "32-true", 16): [_run(8.0, 2.0, state_mb=0.6)],
        Row("gpt", "ddp", 2, "32-true", 16): [_run(5.0, 2.0, state_mb=0.6)],
        Row("gpt", "fsdp2", 2, "32-true", 16): [_run(6.0, 2.0, state_mb=0.3)],
        Row("gpt", "tensor_parallel", 2, "32-true", 16): [_run(7.0, 2.0, state_mb=0.4)],  # exactly the budget
        Row("gpt", "plain-loop", 1, "32-true", 16): [_run(7.5, 2.0, state_mb=0.6)],
        Row("gpt", "plain-ddp", 2, "32-true", 16): [_run(4.5, 2.0, state_mb=None)],  # not counted
    }
    table = build_table(rows, "cpu", {"gpt": {}}, {}, memory_budget_mb=0.4)
    assert [row["fits_budget"] for row in table] == [False, False, True, True, False, None]
    assert [row["state_mb_per_rank"] for row in table] == [0.6, 0.6, 0.3, 0.4, 0.6, None]
    assert table[3]["per_process_batch"] == 16  # the tensor-parallel ranks share every sample
    assert table[2]["plain_key"] == "gpt-plain-ddp-2dev-32-true-b16"
    assert table[3]["plain_key"] == "gpt-plain-loop-1dev-32-true-b16"  # one replica on the whole batch, as one device
    results = {
        "environment": environment("python -m benchmarks --memory-budget-mb 0.4"),
        "settings": {
            "accelerator": "cpu",
            "threads": 1,
            "warmup": 1,
            "steps": 4,
            "repeats": 1,
            "quick": True,
            "memory_budget_mb": 0.4,
        },
        "rows": table,
    }
    text = markdown(results)
    assert (
        "gpt 32-true b16 template, fsdp2 (sharded) x2: 0.30 MB of model state per rank, 50% of ddp's 0.60 MB;" in text
    )
    report = text.splitlines()
    header = next(line for line in report if line.startswith("| workload"))
    assert header.endswith("| peak mem/dev MB | state/rank MB | TFLOP/s | MFU | budget 0.4 MB |")
    lines = {line.split(" | ")[1]: line for line in report if line.startswith("| gpt")}
    assert lines["template, ddp"].endswith("| 0.60 | \u2013 | \u2013 | over budget |")
    assert lines["template, fsdp2 (sharded)"].endswith("| 0.30 | \u2013 | \u2013 | fits |")
    assert lines["template, tensor_parallel (split layers) \u00b9"].endswith("| 0.40 | \u2013 | \u2013 | fits |")
    assert all(line.count("|") == header.count("|") for line in lines.values())
    write_all(tmp_path, results, plots=False)
    written = {row["strategy"]: row for row in csv.DictReader((tmp_path / "results.csv").read_text().splitlines())}
    assert (written["ddp"]["state_mb_per_rank"], written["ddp"]["fits_budget"]) == ("0.6", "False")
    assert written["fsdp2"]["fits_budget"] == "True" and written["plain-ddp"]["fits_budget"] == ""
    without = markdown({**results, "settings": {**results["settings"], "memory_budget_mb": None}})
    assert "over budget" not in without and "budget" not in without.split("| state/rank MB |")[1].splitlines()[0]
