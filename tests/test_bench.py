"""The strategy benchmark: its figures, that its baselines are built by the CLI, and a small real run."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys

import pytest
import torch

from src.bench.__main__ import plan
from src.bench.report import build_table, markdown
from src.bench.runner import Row
from src.bench.stats import scaling_efficiency, summarise_run
from src.bench.workloads import WORKLOADS, build_cli, optimizer_and_scheduler, tokens_per_sample
from tests.conftest import REPO, cli_env


def test_summary_leaves_out_warm_up_and_epoch_boundaries():
    rank = {
        "step_times_s": [9.0, 0.010, 0.012, 5.0, 0.011],  # steps 2..6; step 5 began a new epoch
        "new_epoch": [False, False, False, True, False],
        "cpu_times_s": [9.0, 0.010, 0.010, 5.0, 0.010],
        "steps": 6,
        "first_step_s": 3.0,
        "peak_memory_bytes": 2**20,
        "memory_kind": "max_rss",
        "threads": 1,
        "device": "cpu",
    }
    figures = summarise_run([rank, {**rank, "first_step_s": 3.5}], warmup=2, global_batch=32)
    assert figures["timed_steps"] == 3 and figures["epoch_boundaries_excluded"] == 1
    assert figures["step_ms_median"] == pytest.approx(11.0)
    assert figures["samples_per_s"] == pytest.approx(32 / 0.011)
    assert figures["startup_s"] == 3.5  # the slowest rank
    assert (figures["step_ms_p25"], figures["step_ms_p75"]) == pytest.approx((10.5, 11.5))  # as numpy's default
    assert scaling_efficiency(150.0, 2, 100.0) == pytest.approx(0.75)


def test_every_table_shows_the_template_beside_bare_lightning_and_plain_pytorch():
    args = argparse.Namespace(
        quick=True, workload=["image"], strategies=["ddp"], devices=[2], precisions=None, batch_sizes=[8]
    )
    rows, _ = plan(args, "cpu", {"image": 32})
    assert {(r.strategy, r.processes) for r in rows} == {
        ("single", 1),
        ("bare-lightning", 1),
        ("plain-loop", 1),
        ("ddp", 2),
        ("bare-lightning-ddp", 2),
        ("plain-ddp", 2),
    }
    with pytest.raises(SystemExit, match="Fix: choose from"):
        plan(argparse.Namespace(**{**vars(args), "strategies": ["dpp"]}), "cpu", {"image": 32})


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
        "memory_kind": "max_rss",
        "threads_per_process": [1],
        "processes": 1,
        "device": "cpu",
        "strategy_class": "x",
        "precision_run": "32-true",
        "loss_first": loss,
        "loss_last": loss,
    }


def test_report_splits_the_overhead_into_lightnings_and_the_templates():
    rows = {
        Row("image", "single", 1, "32-true", 8): [_run(7.5, 2.0)],
        Row("image", "bare-lightning", 1, "32-true", 8): [_run(7.0, 2.0)],
        Row("image", "plain-loop", 1, "32-true", 8): [_run(6.0, 2.0)],
    }
    table = build_table(rows, "cpu", {"image": {}}, {})
    template, bare, plain = table
    assert template["overhead_ms_per_step"] == pytest.approx(1.5)  # Lightning's and the template's
    assert template["overhead_vs_bare_ms_per_step"] == pytest.approx(0.5)  # the template's own
    assert bare["overhead_ms_per_step"] == pytest.approx(1.0)  # Lightning's own
    assert bare["overhead_vs_bare_ms_per_step"] is None and plain["overhead_ms_per_step"] is None
    assert template["same_loss_as_bare"] and template["same_loss_as_plain"]
    results = {
        "environment": {
            "command": "python -m src.bench --quick",
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
    assert (
        "the template over bare Lightning +0.50 ms/step (+7.1%" in report and "over the target (0.3 ms/step)" in report
    )
    assert "ratio 1.20: within the target (1.5x)" in report


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_baselines_build_the_workload_through_the_cli(workload):
    """What the baselines train comes from the template's CLI: seeded weights, optimizer, scheduler, clipping."""
    cli = build_cli(WORKLOADS[workload], quick=True, batch_size=8)
    again = build_cli(WORKLOADS[workload], quick=True, batch_size=8)
    for a, b in zip(cli.model.net.parameters(), again.model.net.parameters(), strict=True):
        assert torch.equal(a, b)  # seeded before the model is built: every row starts from the same weights
    assert cli.datamodule.batch_size == 8
    optimizer, scheduler = optimizer_and_scheduler(cli.model)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert {id(p) for group in optimizer.param_groups for p in group["params"]} == {
        id(p) for p in cli.model.net.parameters()
    }
    if workload == "gpt":  # configs/experiment/gpt.yaml, with the --quick overrides on top
        assert cli.model.hparams.n_layer == 2 and tokens_per_sample(cli) == 32
        assert optimizer.defaults["lr"] == 0.002 and isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR)
        assert cli.trainer.gradient_clip_val == 1.0
    else:  # configs/default.yaml
        assert list(cli.model.hparams.widths) == [8, 16] and tokens_per_sample(cli) is None
        assert optimizer.defaults["lr"] == 0.003 and scheduler is None
        assert cli.trainer.gradient_clip_val is None


@pytest.mark.slow
def test_quick_benchmark_runs_all_three_implementations(tmp_path):
    """A real, small run: the template, bare Lightning and plain PyTorch train the same thing, and start-up."""
    command = [sys.executable, "-m", "src.bench", "--quick", "--strategies=single", "--steps=3", "--warmup=1"]
    command += ["--startup-repeats=1", "--no-plots", f"--out={tmp_path}"]
    result = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    results = json.loads((tmp_path / "results.json").read_text())
    rows = {row["strategy"]: row for row in results["rows"]}
    assert set(rows) == {"single", "bare-lightning", "plain-loop"}
    for row in rows.values():
        assert row["samples_per_s"] > 0 and row["step_ms_p25"] <= row["step_ms_median"] <= row["step_ms_p75"]
        assert row["startup_s"] > 0 and row["peak_memory_mb"] > 0 and row["threads_per_process"] == [1]
        assert row["repeats_ok"] == 1 and row["per_process_batch"] == 32
    # the same network, data and optimizer in all three: the same losses, bit for bit on a CPU
    assert rows["single"]["same_loss_as_bare"] and rows["single"]["same_loss_as_plain"]
    assert rows["bare-lightning"]["same_loss_as_plain"]
    assert rows["single"]["overhead_vs_bare_ms_per_step"] is not None
    startup = results["startup"]
    assert startup["cli_help_s"] > 0 and startup["import_lightning_s"] > 0 and startup["repeats"] == 1

    with open(tmp_path / "results.csv") as handle:
        assert len(list(csv.DictReader(handle))) == len(rows)
    report = (tmp_path / "results.md").read_text()
    assert report.count("| image |") == len(rows) and "## Targets" in report and "## Start-up" in report
    assert "the template over bare Lightning" in report and "`python -m src.cli fit --help`" in report
