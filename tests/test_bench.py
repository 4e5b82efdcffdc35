"""The strategy benchmark: its figures, that the baselines train what the CLI trains, and a full ``--quick`` run."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import yaml

from src.bench.stats import quantile, scaling_efficiency, summarise_run
from src.bench.workloads import WORKLOADS, build_datamodule, build_model, cli_flags, resolve
from tests.conftest import REPO, cli_env

QUICK_ROWS = {  # what `python -m src.bench --quick` runs on a CPU: (strategy, devices, processes)
    ("single", 1, 1),
    ("dp", 2, 1),
    ("ddp", 2, 2),
    ("ddp_spawn", 2, 2),
    ("plain-loop", 1, 1),
    ("plain-ddp", 2, 2),
}


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
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(1.75)
    assert scaling_efficiency(150.0, 2, 100.0) == pytest.approx(0.75)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_baselines_read_the_config_the_cli_uses(workload, run_cli):
    """The plain baselines merge the YAML themselves: they must arrive at what ``python -m src.cli fit`` parses."""
    printed = yaml.safe_load(run_cli("fit", *cli_flags(WORKLOADS[workload], quick=True), "--print_config").stdout)
    config = resolve(WORKLOADS[workload], quick=True)
    assert printed["seed_everything"] == config["seed_everything"]
    assert printed["trainer"]["gradient_clip_val"] == config["trainer"].get("gradient_clip_val")
    for section in ("model", "data"):
        assert printed[section]["class_path"] == config[section]["class_path"]
        for key, value in config[section]["init_args"].items():
            if key not in ("optimizer", "lr_scheduler"):
                assert printed[section]["init_args"][key] == value, f"{section}.{key}"
    for factory in ("optimizer", "lr_scheduler"):
        expected = config["model"]["init_args"].get(factory)
        actual = printed["model"]["init_args"].get(factory)
        if expected is None:
            assert actual is None, factory
            continue
        assert actual["class_path"] == expected["class_path"], factory
        for key, value in expected["init_args"].items():
            assert actual["init_args"][key] == value, f"{factory}.{key}"
    assert build_model(config).hparams["num_classes" if workload == "image" else "n_layer"] is not None
    assert build_datamodule(config).batch_size == config["data"]["init_args"]["batch_size"]


@pytest.mark.slow
def test_quick_benchmark_writes_sane_results(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "src.bench", "--quick", f"--out={tmp_path}"],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for name in ("results.json", "results.csv", "results.md", "throughput_vs_devices.png", "lightning_vs_plain.png"):
        assert (tmp_path / name).stat().st_size > 0, name

    results = json.loads((tmp_path / "results.json").read_text())
    rows = results["rows"]
    assert {(r["strategy"], r["devices"], r["processes"]) for r in rows} == QUICK_ROWS
    for row in rows:
        assert row["samples_per_s"] > 0 and row["step_ms_median"] > 0 and row["step_ms_mean"] > 0, row["key"]
        assert row["step_ms_p25"] <= row["step_ms_median"] <= row["step_ms_p75"], row["key"]
        assert 0 < row["scaling_efficiency"] < 2, row["key"]
        assert row["startup_s"] > 0 and row["peak_memory_mb"] > 0, row["key"]
        assert row["threads_per_process"] == [1], row["key"]  # fixed and the same in every process
        assert row["repeats_ok"] == 1 and row["per_process_batch"] == 32 // row["processes"]
    by_strategy = {r["strategy"]: r for r in rows}
    assert by_strategy["single"]["scaling_efficiency"] == pytest.approx(1.0)
    for strategy in ("single", "ddp", "ddp_spawn"):
        row = by_strategy[strategy]
        assert row["throughput_vs_plain"] > 0 and row["overhead_ms_per_step"] is not None, strategy
        assert row["same_loss_as_plain"], strategy  # same network, data and optimizer as the baseline
    assert "pass-through" in by_strategy["dp"]["note"]

    with open(tmp_path / "results.csv") as handle:
        assert len(list(csv.DictReader(handle))) == len(rows)
    report = (tmp_path / "results.md").read_text()
    assert "python -m src.bench --quick" in report and "1 thread(s) per process" in report
    assert report.count("| image |") == len(rows)
    assert "## Targets" in report
