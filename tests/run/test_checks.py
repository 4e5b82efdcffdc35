"""Unit tests of multigpu/run/checks.py."""

from __future__ import annotations

import os

import lightning as L
import pytest
import torch
from lightning.pytorch.cli import instantiate_class

from multigpu.checkpoints.resume import load_checkpoint
from multigpu.errors import ConfigurationError
from multigpu.facts import RunFacts
from multigpu.facts.argv import import_class
from multigpu.run.checks import (
    check_checkpoint_fits,
    check_checkpoint_model,
    check_compile,
    check_model_flags,
    check_optimizer,
    check_run_dir,
)
from multigpu.strategies import register_strategies
from tests.conftest import TINY_RUN
from tests.errors.test_errors import fails_cleanly
from tests.fixtures.workload import TinyClassifier


def test_run_dir_must_be_a_folder(tmp_path):
    check_run_dir(tmp_path / "new" / "run")  # a folder that does not exist yet is fine
    check_run_dir(None)
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "run"):
        with pytest.raises(ConfigurationError, match="is a file"):
            check_run_dir(path)


def test_run_dir_must_be_writable(tmp_path, monkeypatch):
    """A folder on a read-only file system, as access(2) reports it to every user, root included (CI runs as root)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if path == locked else access(path, mode))
    with pytest.raises(ConfigurationError, match=f"{locked} is not writable"):
        check_run_dir(locked / "run")
    check_run_dir(tmp_path / "open" / "run")  # its writable neighbour passes


def optimizer_callable(class_path: str, **init_args):
    return lambda params: instantiate_class(params, {"class_path": class_path, "init_args": init_args})


def test_optimizer_and_scheduler_are_built_before_launch():
    model = TinyClassifier(hidden=8, optimizer=optimizer_callable("torch.optim.SGD", lr=0.1))
    check_optimizer(model)
    model.optimizer_factory = optimizer_callable("torch.optim.SGD", lr=-0.1)
    with pytest.raises(ConfigurationError, match=r"--model.init_args.optimizer .*Invalid learning rate"):
        check_optimizer(model)
    model.optimizer_factory = optimizer_callable("torch.optim.SGD", lr=0.1)
    model.lr_scheduler_factory = lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, total_steps=0)
    with pytest.raises(ConfigurationError, match=r"--model.init_args.lr_scheduler .*total_steps"):
        check_optimizer(model)
    check_optimizer(torch.nn.Linear(1, 1))  # a model without optimizer_factory is left alone


def save_checkpoint(path, model: L.LightningModule, **extra) -> None:
    torch.save({"state_dict": model.state_dict(), **extra}, path)


def test_checkpoint_checks(tmp_path):
    model = TinyClassifier(hidden=16)
    same = tmp_path / "same.ckpt"
    save_checkpoint(same, model, hyper_parameters={"_class_path": "tests.fixtures.TinyClassifier", "hidden": 16})
    checkpoint = load_checkpoint(same)
    check_checkpoint_fits(model, checkpoint, same)
    check_checkpoint_model(checkpoint, same, "tests.fixtures.TinyClassifier")
    check_checkpoint_model(checkpoint, same, "tests.fixtures.workload.TinyClassifier")  # the same class, another path
    assert import_class("tests.fixtures.TinyClassifier") is TinyClassifier and import_class("no.Such") is None
    with pytest.raises(ConfigurationError, match=r"TinyClassifier, but the config builds a Other"):
        check_checkpoint_model(checkpoint, same, "Other")
    check_model_flags(["--model.init_args.hidden=16"], {"hidden": 16}, checkpoint, same)
    with pytest.raises(ConfigurationError, match=r"--model.init_args.hidden=8 differs .* trained with hidden=16"):
        check_model_flags(["--model.init_args.hidden=8"], {"hidden": 8}, checkpoint, same)

    wider = tmp_path / "wider.ckpt"
    save_checkpoint(wider, TinyClassifier(hidden=32))
    with pytest.raises(ConfigurationError, match="of another shape") as error:
        check_checkpoint_fits(model, load_checkpoint(wider), wider)
    assert len(str(error.value)) < 800  # one paragraph, not one line per tensor

    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigurationError, match="not a readable checkpoint"):
        load_checkpoint(garbage)
    assert garbage.read_bytes() == b"not a checkpoint"


def test_check_compile_refuses_the_strategy_class_of_the_facts():
    register_strategies()
    check_compile(RunFacts.of({"strategy": "ddp"}))
    with pytest.raises(ConfigurationError, match=r"^--compile=true does not work with --trainer.strategy=dp: dp"):
        check_compile(RunFacts.of({"strategy": "dp", "devices": 1}))


# -- the checkpoint against the configured model, through the command line --------------------------------------


class OtherClassifier(TinyClassifier):
    """Another model class, with the same options and weights as the one the run trained."""


def test_checkpoint_of_another_model(capsys, untouched, tmp_path):
    ckpt = untouched / "checkpoints" / "last.ckpt"
    other = ["--model=tests.run.test_checks.OtherClassifier", f"--trainer.default_root_dir={tmp_path / 'other'}"]
    err = fails_cleanly(
        capsys,
        ["fit", *TINY_RUN, *other, f"--ckpt_path={ckpt}"],
        f"--ckpt_path={ckpt}",
        "holds a tests.fixtures.workload.TinyClassifier",
        "builds a tests.run.test_checks.OtherClassifier",
    )
    assert len(err) < 1200


def test_checkpoint_with_other_shapes(capsys, untouched, tmp_path):
    """A checkpoint whose hyperparameters were lost (saved outside the CLI): its tensors are compared instead."""
    checkpoint = torch.load(untouched / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint.pop("hyper_parameters", None)
    stripped = tmp_path / "stripped.ckpt"
    torch.save(checkpoint, stripped)
    fails_cleanly(
        capsys,
        [
            "validate",
            *TINY_RUN,
            f"--trainer.default_root_dir={tmp_path}",
            "--model.init_args.hidden=64",
            f"--ckpt_path={stripped}",
        ],
        "weights of another model",
        "of another shape",
    )
