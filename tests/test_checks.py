"""Unit tests of src/checks.py and of how src/errors.py tells a configuration error from an error in training code."""

from __future__ import annotations

import os

import lightning as L
import pytest
import torch
from lightning.pytorch.cli import instantiate_class

from src.checks import (
    check_checkpoint_fits,
    check_checkpoint_model,
    check_optimizer,
    check_run_dir,
    load_checkpoint,
    yaml_problem,
)
from src.errors import (
    ConfigurationError,
    building_error,
    config_hook_of,
    configuration_error_of,
    from_spawned_traceback,
    lost_peer,
)
from tests.fixtures.workload import TinyClassifier


def test_yaml_problem_names_file_line_and_column(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("trainer:\n  max_steps: 3\n")
    bad.write_text("trainer:\n  max_steps: 3\n   devices: 2\n")
    assert yaml_problem(["fit", "--config", str(good)]) is None
    problem = yaml_problem(["fit", "--config", str(good), f"--config={bad}"])
    assert problem is not None and str(bad) in problem and "line 3" in problem and "Fix:" in problem
    assert yaml_problem(["fit", "--config", str(tmp_path / "missing.yaml")]) is None  # jsonargparse reports it


def test_run_dir_must_be_a_folder(tmp_path):
    check_run_dir(tmp_path / "new" / "run")  # a folder that does not exist yet is fine
    check_run_dir(None)
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "run"):
        with pytest.raises(ConfigurationError, match="is a file"):
            check_run_dir(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_run_dir_must_be_writable(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigurationError, match="not writable"):
        check_run_dir(locked / "run")


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
    save_checkpoint(same, model, hyper_parameters={"_class_path": "tests.fixtures.TinyClassifier"})
    check_checkpoint_fits(model, same)
    check_checkpoint_model(same, "tests.fixtures.TinyClassifier")
    check_checkpoint_model(same, "tests.fixtures.workload.TinyClassifier")  # the same class, another path
    with pytest.raises(ConfigurationError, match=r"TinyClassifier, but the config builds a Other"):
        check_checkpoint_model(same, "Other")

    wider = tmp_path / "wider.ckpt"
    save_checkpoint(wider, TinyClassifier(hidden=32))
    with pytest.raises(ConfigurationError, match="of another shape") as error:
        check_checkpoint_fits(model, wider)
    assert len(str(error.value)) < 800  # one paragraph, not one line per tensor

    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigurationError, match="cannot be read"):
        load_checkpoint(garbage)


class Hook(L.LightningDataModule):
    def setup(self, stage: str) -> None:
        raise KeyError("split")


class Steps(L.LightningModule):
    def training_step(self, batch, batch_idx):
        raise KeyError("batch")


def raised(call) -> BaseException:
    try:
        call()
    except BaseException as error:
        return error
    raise AssertionError("did not raise")


def test_errors_are_classified_by_the_hook_they_come_from():
    setup_error = raised(lambda: Hook().setup("fit"))
    assert config_hook_of(setup_error.__traceback__) == ("--data", "Hook.setup")
    error = configuration_error_of(setup_error)
    assert error is not None and "Hook.setup" in str(error) and "KeyError" in str(error) and "Fix:" in str(error)
    step_error = raised(lambda: Steps().training_step(None, 0))
    assert config_hook_of(step_error.__traceback__) is None and configuration_error_of(step_error) is None


def test_building_error_names_the_class_and_option():
    def build():
        try:
            TinyClassifier(hidden=-1)
        except Exception as error:
            raise ValueError("Does not validate against any of the Union subtypes") from error  # as jsonargparse does

    error = building_error(raised(build))
    assert "building TinyClassifier" in str(error) and "--model" in str(error)


def test_spawned_worker_traceback_is_read_back():
    text = (
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
        '  File "/x/data.py", line 3, in setup\n    raise ValueError("bad split")\nValueError: bad split\n'
    )
    error = from_spawned_traceback(text)
    assert error is not None and "setup" in str(error) and "ValueError: bad split" in str(error)
    assert from_spawned_traceback(text.replace("in setup", "in training_step")) is None
    reported = from_spawned_traceback("Traceback...\nsrc.errors.ConfigurationError: --data.x=1 is wrong. Fix: y.\n")
    assert reported is not None and str(reported) == "--data.x=1 is wrong. Fix: y."


def test_lost_peer_is_recognised():
    assert lost_peer(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:123"))
    assert not lost_peer(RuntimeError("CUDA out of memory"))
