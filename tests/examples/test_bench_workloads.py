"""The benchmark's built-in workloads, the examples: built through the CLI from their own presets, whatever
configs/default.yaml names, and a small real run."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import src.cli
from benchmarks.workloads import WORKLOADS, build_cli, optimizer_and_scheduler, tokens_per_sample
from src.cli import CLI
from tests import prewarmed
from tests.conftest import REPO, cli_env
from tests.examples.conftest import EXPERIMENTS, TINY_GPT, TINY_IMAGE


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
    else:  # configs/experiment/image_synthetic.yaml
        assert list(cli.model.hparams.widths) == [8, 16] and tokens_per_sample(cli) is None
        assert optimizer.defaults["lr"] == 0.003 and scheduler is None
        assert cli.trainer.gradient_clip_val is None


@pytest.mark.slow
@pytest.mark.extended
def test_quick_benchmark_runs_all_three_implementations_and_their_ddp_rows_in_order(tmp_path):
    """A real, small run: the template, bare Lightning and plain PyTorch train the same thing, on one device and
    under DDP, and start-up. The rows that start processes run one after another in the order ``python -m benchmarks
    --quick`` runs them (the template's ddp, then each baseline's DDP after its one-device row): each ends with exit
    status 0 and every rank's figures, whatever the rows before it left behind."""
    command = [sys.executable, "-m", "benchmarks", "--quick", "--strategies=ddp", "--steps=3", "--warmup=1"]
    command += ["--startup-repeats=1", "--no-plots", f"--out={tmp_path}"]
    result = prewarmed.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    results = json.loads((tmp_path / "results.json").read_text())
    order = [row["strategy"] for row in results["rows"]]
    # the order they ran in: the template's rows, then each baseline's one-device row before its DDP row
    assert order == ["single", "ddp", "bare-lightning", "bare-lightning-ddp", "plain-loop", "plain-ddp"]
    rows = {row["strategy"]: row for row in results["rows"]}
    for row in rows.values():
        assert row["status"] == "ok" and row["repeats_ok"] == 1, row
        assert row["samples_per_s"] > 0 and row["step_ms_p25"] <= row["step_ms_median"] <= row["step_ms_p75"]
        assert row["startup_s"] > 0 and row["peak_memory_mb"] > 0
        processes = 2 if row["strategy"] in ("ddp", "bare-lightning-ddp", "plain-ddp") else 1
        assert row["processes"] == processes and row["per_process_batch"] == 32 // processes
        assert row["threads_per_process"] == [1]  # every rank's thread count, each value once
    for log in (tmp_path / "runs").glob("*/output.log"):
        assert "terminate called" not in log.read_text(), log
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


#: a project's own model in configs/default.yaml (docs/models.md, step 6), the examples kept: a plain
#: LightningModule, and a TemplateModule whose optimizer, scheduler and options share names with the examples'
USER_MODELS = {
    "plain LightningModule": {
        "model": {"class_path": "tests.zoo.regression.Regressor", "init_args": {"hidden": 8, "lr": 0.5}},
        "data": {"class_path": "tests.zoo.regression.RegressionData", "init_args": {"batch_size": 7}},
    },
    "with an optimizer block": {
        "model": {
            "class_path": "tests.fixtures.workload.TinyClassifier",
            "init_args": {
                "num_classes": 3,
                "dropout": 0.5,
                "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.5, "weight_decay": 0.1}},
                "lr_scheduler": {"class_path": "torch.optim.lr_scheduler.StepLR", "init_args": {"step_size": 1}},
            },
        },
        "data": {"class_path": "tests.fixtures.workload.TinyData", "init_args": {"batch_size": 7}},
    },
}
#: the other settings such a project changes for its model: none of them is the examples'
USER_SETTINGS = {
    "seed_everything": 7,
    "trainer": {"max_epochs": 5, "gradient_clip_val": 0.5, "accumulate_grad_batches": 2},
    "checkpoint": {"monitor": "val/mse", "mode": "max"},
}
CIFAR10_RECIPE = ["--config", str(EXPERIMENTS / "image.yaml"), "--trainer.accelerator=cpu", "--trainer.devices=1"]
#: how each example is built: the benchmark's workloads (full size), the CIFAR-10 recipe and the flags of the
#: examples' tests
EXAMPLES = {
    "image workload": lambda: build_cli(WORKLOADS["image"], quick=False),
    "gpt workload": lambda: build_cli(WORKLOADS["gpt"], quick=False),
    "cifar-10 recipe": lambda: CLI(args=[*CIFAR10_RECIPE, "--trainer.logger=false"], run=False),
    "image tests": lambda: CLI(args=[*TINY_IMAGE, "--trainer.logger=false"], run=False),
    "gpt tests": lambda: CLI(args=[*TINY_GPT, "--trainer.logger=false"], run=False),
}


def what_it_trains(cli: Any) -> dict[str, Any]:
    """The resolved config of a built example, its optimizer and scheduler, and its initial weights."""
    config = cli.config.clone().as_dict()
    for files in ("config", "__default_config__"):  # which files were read, not what they set
        config.pop(files, None)
    optimizer, scheduler = optimizer_and_scheduler(cli.model)
    return {
        "config": config,
        "optimizer": (type(optimizer), optimizer.defaults),
        "scheduler": (type(scheduler), scheduler.state_dict() if scheduler is not None else None),
        "weights": [p.detach().clone() for p in cli.model.parameters()],
    }


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two ``what_it_trains``: config sections, optimizer, scheduler, weights."""
    found = [f"config.{key}" for key in {*a["config"], *b["config"]} if a["config"].get(key) != b["config"].get(key)]
    found += [key for key in ("optimizer", "scheduler") if a[key] != b[key]]
    same_weights = len(a["weights"]) == len(b["weights"]) and all(map(torch.equal, a["weights"], b["weights"]))
    return found if same_weights else [*found, "weights"]


@pytest.fixture(scope="module")
def as_the_template_ships() -> dict[str, dict[str, Any]]:
    return {name: what_it_trains(build()) for name, build in EXAMPLES.items()}


@pytest.mark.parametrize("user", USER_MODELS)
def test_a_users_default_config_changes_nothing_the_examples_train(
    user, as_the_template_ships, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """configs/default.yaml pointed at a project's own model: the benchmark's example workloads and the examples'
    tests build the model, optimizer, data, seed and trainer settings of the template as shipped: their own."""
    default = yaml.safe_load(src.cli.DEFAULT_CONFIG.read_text())
    default.update(USER_MODELS[user], seed_everything=USER_SETTINGS["seed_everything"])
    for section in ("trainer", "checkpoint"):
        default[section] = {**default.get(section, {}), **USER_SETTINGS[section]}
    (tmp_path / "default.yaml").write_text(yaml.safe_dump(default))
    monkeypatch.setattr(src.cli.CLI, "default_config", tmp_path / "default.yaml")  # where every CLI run reads it

    built = {}
    for name, build in EXAMPLES.items():
        built[name] = build()
        assert differences(what_it_trains(built[name]), as_the_template_ships[name]) == [], name
    image, _ = optimizer_and_scheduler(built["image workload"].model)
    assert isinstance(image, torch.optim.AdamW) and image.defaults["lr"] == 0.003
    assert image.defaults["weight_decay"] == 0.01
    gpt, schedule = optimizer_and_scheduler(built["gpt workload"].model)
    assert isinstance(gpt, torch.optim.AdamW) and gpt.defaults["lr"] == 0.002 and gpt.defaults["betas"] == (0.9, 0.95)
    assert isinstance(schedule, torch.optim.lr_scheduler.CosineAnnealingLR)
    for cli in built.values():
        assert cli.config.seed_everything == 42 and cli.trainer.accumulate_grad_batches == 1
    assert built["image workload"].trainer.gradient_clip_val is None
    assert built["gpt workload"].trainer.gradient_clip_val == 1.0
