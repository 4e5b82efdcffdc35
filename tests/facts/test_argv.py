"""The command line read as written (multigpu/facts/argv.py): which --config file set an option, the YAML of the
files checked with its line, the class a class_path names, the classes the arguments name (read as the parser reads
them) and the default config rebased so that a changed class starts from its own defaults."""

from __future__ import annotations

import yaml

from multigpu.facts.argv import (
    changes_class,
    chosen_classes,
    given_as,
    import_class,
    option_origin,
    rebased_defaults,
    yaml_problem,
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


TINY_MODEL = "tests.fixtures.workload.TinyClassifier"
DEFAULTS = {
    "model": {"class_path": TINY_MODEL, "init_args": {"hidden": 64}},
    "data": {"class_path": "tests.fixtures.workload.TinyData", "init_args": {"batch_size": 8}},
    "trainer": {"max_steps": 5},
}


def test_the_classes_are_read_as_the_parser_reads_them_the_last_one_winning(tmp_path):
    config = tmp_path / "classes.yaml"
    config.write_text("model:\n  class_path: pkg.FromFile\ndata: pkg.DataFromFile\n")
    argv = ["--model=pkg.BeforeTheSubcommand", "fit", "--model", "pkg.Spaced", "--config", str(config),
            "--data.class_path=pkg.Flag"]  # fmt: skip
    assert chosen_classes(argv, "fit") == {"model": "pkg.FromFile", "data": "pkg.Flag"}
    assert chosen_classes(["fit", "--config", "{model: pkg.Inline}"], "fit") == {"model": "pkg.Inline", "data": None}
    assert chosen_classes(["--model=pkg.M"], None) == {"model": "pkg.M", "data": None}  # no subcommand
    # an option where the class should be names none; a config that is no YAML is left to the parser to report
    assert chosen_classes(["fit", "--model", "--trainer.max_steps=3"], "fit") == {"model": None, "data": None}
    assert chosen_classes(["fit", "--config", "{model: [", "--data=pkg.D"], "fit") == {"model": None, "data": "pkg.D"}


def test_a_changed_class_starts_from_its_own_defaults_and_the_rest_of_the_default_config_stays(tmp_path):
    default_config = tmp_path / "default.yaml"
    default_config.write_text(yaml.safe_dump(DEFAULTS))
    regressor = "tests.zoo.regression.Regressor"
    rebased = rebased_defaults({"model": regressor, "data": None}, default_config)
    # the changed section is the new class alone (its own defaults), every other section is the file's
    assert rebased == {"model": {"class_path": regressor}, "data": DEFAULTS["data"], "trainer": DEFAULTS["trainer"]}
    assert changes_class(regressor, TINY_MODEL)
    # the default's own class (by any of its import paths) changes nothing, nor does a name that is no class
    for same in (TINY_MODEL, "tests.fixtures.TinyClassifier", "no.such.Model"):
        assert not changes_class(same, TINY_MODEL), same
        assert rebased_defaults({"model": same, "data": None}, default_config) is None, same
    assert rebased_defaults({"model": None, "data": None}, default_config) is None  # nothing named: not read


def test_a_section_that_names_its_class_alone_is_rebased_too(tmp_path):
    """configs/default.yaml names its classes alone (``model: pkg.Model``): jsonargparse would still fill in that
    class's own defaults and carry over those another class also takes (a ``batch_size``), so it is rebased too."""
    default_config = tmp_path / "default.yaml"
    default_config.write_text(
        f"model: {TINY_MODEL}\ndata: tests.fixtures.workload.TinyData\ntrainer:\n  max_steps: 5\n"
    )
    rebased = rebased_defaults({"model": None, "data": "tests.zoo.regression.RegressionData"}, default_config)
    assert rebased == {"model": TINY_MODEL, "data": {"class_path": "tests.zoo.regression.RegressionData"},
                       "trainer": {"max_steps": 5}}  # fmt: skip
    assert rebased_defaults({"model": TINY_MODEL, "data": None}, default_config) is None
