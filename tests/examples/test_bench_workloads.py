"""The benchmark's built-in workloads, the examples: built through the CLI, and a small real run."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch

from benchmarks.workloads import WORKLOADS, build_cli, optimizer_and_scheduler, tokens_per_sample
from tests.conftest import REPO, cli_env


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
    command = [sys.executable, "-m", "benchmarks", "--quick", "--strategies=single", "--steps=3", "--warmup=1"]
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
    assert report.count("| image |") == len(rows) and "## Start-up" in report
    assert "## The template against its baselines" in report and "target" not in report.lower()
    assert "the template over bare Lightning" in report and "`python -m src.cli fit --help`" in report
