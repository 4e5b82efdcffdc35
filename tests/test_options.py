"""The command line's options on top of LightningCLI's (multigpu/options.py): the model and data classes the arguments
name, read before parsing, and the arguments rebased so that a changed class starts from its own defaults. The
options themselves are tested through the command line (tests/test_cli.py, tests/test_errors.py)."""

from __future__ import annotations

import yaml

from multigpu.options import changes_class, chosen_classes, rebased_defaults

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
