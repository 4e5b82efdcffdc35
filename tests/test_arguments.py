"""The command line read as written (multigpu/arguments.py): which --config file set an option, the YAML of the
files checked with its line, and the class a class_path names."""

from __future__ import annotations

from multigpu.arguments import given_as, import_class, option_origin, yaml_problem
from tests.fixtures.workload import TinyClassifier


def test_yaml_problem_names_file_line_and_column(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("trainer:\n  max_steps: 3\n")
    bad.write_text("trainer:\n  max_steps: 3\n   devices: 2\n")
    assert yaml_problem(["fit", "--config", str(good)]) is None
    problem = yaml_problem(["fit", "--config", str(good), f"--config={bad}"])
    assert problem is not None and str(bad) in problem and "line 3" in problem and "Fix:" in problem
    assert yaml_problem(["fit", "--config", str(tmp_path / "missing.yaml")]) is None  # jsonargparse reports it


def test_the_config_file_that_set_an_option_last_is_named_with_the_flags_it_overrides(tmp_path):
    preset = tmp_path / "gpu.yaml"
    preset.write_text("trainer:\n  devices: 4\n")
    assert option_origin(["fit", "--trainer.devices=2"], "devices") == (None, [])
    args = ["fit", "--trainer.devices=2", "--config", str(preset)]
    assert option_origin(args, "devices") == (str(preset), ["--trainer.devices=2"])
    assert option_origin([*args, "--trainer.devices", "1"], "devices") == (None, [])  # a later flag wins
    shown = given_as(args, "devices", 4)
    assert shown.startswith(f"--trainer.devices=4 (set by {preset}") and "put --config files first" in shown
    assert given_as(["fit"], "devices", [0, 1]) == "--trainer.devices=[0, 1]"


def test_a_class_path_names_its_class_or_none():
    assert import_class("tests.fixtures.workload.TinyClassifier") is TinyClassifier
    assert import_class("tests.fixtures.workload.NoSuchClass") is None
    assert import_class("no_such_package.Model") is None
