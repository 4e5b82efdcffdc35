"""The examples' presets, configs/experiment/*.yaml, and the project's configs/default.yaml, which names the image
example: each parses to what it says, and runs."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from src.cli import main
from tests.conftest import REPO, TINY, last_value, read_metrics
from tests.examples.conftest import write_cifar10
from tests.workflows.test_configs import assert_contains
from tests.workflows.test_configs import resolved as resolved_by

EXPERIMENTS = sorted((REPO / "configs" / "experiment").glob("*.yaml"))


def resolved(capsys, *args: str) -> dict:
    """The config ``python -m src.cli fit ARGS`` resolves to."""
    return resolved_by(capsys, *args, command=main)


def test_the_default_config_parses_to_what_it_says(capsys):
    # after the tests' own config, as every config file of configs/ is read (tests/workflows/test_configs.py)
    path = REPO / "configs" / "default.yaml"
    config = resolved(capsys, *TINY, "--config", str(path))
    assert_contains(yaml.safe_load(path.read_text()), config)


def test_every_preset_is_tested():
    assert [p.name for p in EXPERIMENTS] == ["gpt.yaml", "gpt_gpu.yaml", "image.yaml", "image_synthetic.yaml"]


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_experiment_parses_to_what_it_says(path, capsys):
    config = resolved(capsys, "--config", str(path))
    assert_contains(yaml.safe_load(path.read_text()), config)


def test_print_config_of_a_preset_round_trips(tmp_path, capsys):
    first = resolved(capsys, "--config", "configs/experiment/gpt.yaml", "--trainer.max_steps=7")
    saved = tmp_path / "resolved.yaml"
    saved.write_text(yaml.safe_dump(first))
    assert resolved(capsys, "--config", str(saved)) == first
    assert first["model"]["class_path"] == "src.models.CausalLanguageModel"
    assert first["trainer"]["max_steps"] == 7


def test_image_experiment_on_cifar_format_files(tmp_path):
    write_cifar10(tmp_path / "cifar", per_file=40)
    run_dir = tmp_path / "run"
    main([
        "fit", "--config", "configs/experiment/image.yaml", "--trainer.accelerator=cpu",
        f"--data.init_args.data_dir={tmp_path / 'cifar'}", "--data.init_args.download=false",
        "--data.init_args.val_size=40", "--data.init_args.batch_size=32", "--data.init_args.num_workers=2",
        "--model.init_args.widths=[8,16]", "--trainer.max_epochs=1", "--progress_bar=none",
        f"--trainer.default_root_dir={run_dir}",
    ])  # fmt: skip
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 160 // 32


def test_gpt_experiment(tmp_path):
    run_dir = tmp_path / "run"
    main([
        "fit", "--config", "configs/experiment/gpt.yaml", "--trainer.accelerator=cpu", "--trainer.max_steps=4",
        "--trainer.val_check_interval=2", "--trainer.limit_val_batches=2", "--model.init_args.n_layer=1",
        "--progress_bar=none", f"--trainer.default_root_dir={run_dir}",
    ])  # fmt: skip
    rows = read_metrics(run_dir)
    loss, perplexity = last_value(rows, "val/loss"), last_value(rows, "val/perplexity")
    assert perplexity == pytest.approx(math.exp(loss), rel=1e-5)  # of the mean loss, not a mean of exps
    assert loss < math.log(256)  # four steps already beat guessing uniformly among the 256 byte values


def test_image_schedule_lasts_exactly_the_run():
    # OneCycleLR must end on the run's last step: the sampler drops the incomplete last batch of each epoch
    config = yaml.safe_load((REPO / "configs" / "experiment" / "image.yaml").read_text())
    data, schedule = config["data"]["init_args"], config["model"]["init_args"]["lr_scheduler"]["init_args"]
    steps_per_epoch = (50000 - 5000) // data["batch_size"]  # CIFAR-10's training images less the default val_size
    assert schedule["total_steps"] == config["trainer"]["max_epochs"] * steps_per_epoch
