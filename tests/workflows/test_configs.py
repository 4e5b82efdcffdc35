"""Every file in configs/ parses to what it says, and runs where this machine allows (the example workloads' own
presets, configs/experiment/, and configs/default.yaml, which names them, are tested in
tests/examples/test_experiment_configs.py, the sweep files of configs/sweep/ in tests/examples/test_sweep_files.py)."""

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from tests.cli import main
from tests.conftest import REPO, TINY, last_value, read_metrics

# configs/sweep/ holds sweep files, not fit configs (tests/examples/test_sweep_files.py reads them)
CONFIGS = sorted(
    p
    for p in (REPO / "configs").rglob("*.yaml")
    if not {"experiment", "sweep"} & set(p.relative_to(REPO).parts) and p != REPO / "configs" / "default.yaml"
)
GPU_PRESETS = [
    "trainer/gpu.yaml",
    "trainer/dp.yaml",
    "trainer/ddp.yaml",
    "trainer/ddp_spawn.yaml",
    "trainer/multinode.yaml",
]
QUICK = [
    "--trainer.max_steps=3",
    "--trainer.limit_train_batches=3",
    "--trainer.limit_val_batches=2",
    "--progress_bar=none",
]


def name(path: Path) -> str:
    return str(path.relative_to(REPO / "configs"))


def resolved(capsys, *args: str, command: Callable[[list[str]], None] = main) -> dict:
    """The config ``fit ARGS`` resolves to, as ``command`` (a project's ``main``) prints it."""
    with pytest.raises(SystemExit) as exit_info:
        command(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def assert_contains(expected, actual, where: str = "") -> None:
    """Every value the config file sets is in the resolved config."""
    if isinstance(expected, dict):
        for key, value in expected.items():
            assert key in actual, f"{where}.{key} missing"
            assert_contains(value, actual[key], f"{where}.{key}")
    else:
        if isinstance(actual, list) and isinstance(expected, list):
            assert list(actual) == list(expected), where
        elif isinstance(actual, dict) and "class_path" in actual and isinstance(expected, str):
            assert actual["class_path"] == expected, where  # a class named alone, which starts from its defaults
        else:
            assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def test_every_config_file_is_tested():
    assert len(CONFIGS) >= 19  # and configs/default.yaml: tests/examples/test_experiment_configs.py
    assert {name(p) for p in CONFIGS} >= {*GPU_PRESETS, "trainer/cpu.yaml", "trainer/ddp_cpu.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_config_parses_to_what_it_says(path, capsys):
    # after the tests' own config, so that each file is read over a workload that is always there
    config = resolved(capsys, *TINY, "--config", str(path))
    assert_contains(yaml.safe_load(path.read_text()), config)


def fit(tmp_path: Path, *args: str) -> Path:
    run_dir = tmp_path / "run"
    main(["fit", *TINY, *args, f"--trainer.default_root_dir={run_dir}"])
    return run_dir


# -- tiny runs of the presets this machine can run ------------------------------------------------------------


def test_cpu_preset(tmp_path):
    run_dir = fit(tmp_path, "--config", "configs/trainer/cpu.yaml", *QUICK)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3


@pytest.mark.slow
def test_two_process_cpu_ddp_preset(tmp_path, run_cli):
    run_cli("fit", *TINY, "--config", "configs/trainer/ddp_cpu.yaml", *QUICK, f"--trainer.default_root_dir={tmp_path}")
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_gpu_presets_refuse_clearly_without_a_gpu(preset, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        fit(tmp_path, "--config", f"configs/{preset}", *QUICK)
    assert exit_info.value.code == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_dp_preset_on_the_cpu_runs_as_one_device(tmp_path):
    with pytest.warns(UserWarning, match="runs as a single device"):
        run_dir = fit(
            tmp_path, "--config", "configs/trainer/dp.yaml", "--trainer.accelerator=cpu", "--trainer.devices=2", *QUICK
        )
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


# on the CPU Lightning runs 16-mixed as bf16-mixed (fp16 autocast is for GPUs); weights stay fp32 in every preset
@pytest.mark.parametrize(
    ("preset", "precision", "activation"),
    [("32", "32-true", "torch.float32"), ("16-mixed", "bf16-mixed", "torch.bfloat16"),
     ("bf16-mixed", "bf16-mixed", "torch.bfloat16")],
)  # fmt: skip
def test_precision_presets_compute_in_their_dtype(preset, precision, activation, tmp_path):
    record = tmp_path / "dtypes.json"
    recorder = json.dumps({"class_path": "tests.helpers.RecordComputeDtypes", "init_args": {"path": str(record)}})
    run_dir = fit(tmp_path, "--config", f"configs/precision/{preset}.yaml", *QUICK, f"--trainer.callbacks+={recorder}")
    assert json.loads(record.read_text()) == {
        "precision": precision,
        "activation": activation,
        "weight": "torch.float32",
    }
    assert math.isfinite(last_value(read_metrics(run_dir), "train/loss_epoch"))


def test_csv_logger_preset(tmp_path):
    run_dir = fit(tmp_path, "--config", "configs/logger/csv.yaml", *QUICK)
    assert {"val/loss", "val/acc"} <= set(read_metrics(run_dir)[0].keys())


def test_tensorboard_logger_preset(tmp_path):
    run_dir = fit(tmp_path, "--config", "configs/logger/tensorboard.yaml", *QUICK)
    assert list((run_dir / "logs" / "version_0").glob("events.out.tfevents.*"))


def test_fast_dev_run_preset_writes_nothing(tmp_path):
    run_dir = fit(tmp_path, "--config", "configs/debug/fast_dev_run.yaml")
    assert not list(run_dir.rglob("*.ckpt")) and not list(run_dir.rglob("metrics.csv"))


def test_limit_preset(tmp_path):
    run_dir = fit(tmp_path, "--config", "configs/debug/limit.yaml", "--progress_bar=none")
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 2 * 16  # 512 samples / 32 = 16 batches per epoch < the limit of 20


@pytest.mark.slow
def test_overfit_preset_drives_the_training_loss_down(tmp_path):
    run_dir = fit(tmp_path, "--config", "configs/debug/overfit.yaml", "--progress_bar=none")
    losses = [float(r["train/loss_epoch"]) for r in read_metrics(run_dir) if r["train/loss_epoch"]]
    assert len(losses) == 60
    assert losses[-1] < 0.3 * losses[0]


def test_profiler_preset_writes_a_report_and_a_trace(tmp_path):
    run_dir = fit(tmp_path, "--config", "configs/debug/profiler.yaml", "--progress_bar=none")
    written = [p.name for p in run_dir.rglob("*") if p.is_file()]
    assert any(n.startswith("fit-profile") and n.endswith(".txt") for n in written), written
    assert any(n.endswith(".pt.trace.json") for n in written), written
