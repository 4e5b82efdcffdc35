"""The command line's options on top of LightningCLI's (multigpu/run/parser.py): a parser whose errors are one
paragraph,
and a default config that names classes only, so that a class the arguments change starts from its own defaults
with no machinery of the engine's. The options themselves are tested through the command line (tests/run/test_cli.py,
tests/errors/test_errors.py)."""

from __future__ import annotations

import pytest

from multigpu import TemplateCLI
from multigpu.run.parser import TemplateArgumentParser


def project_cli(tmp_path, text: str) -> type[TemplateCLI]:
    config = tmp_path / "default.yaml"
    config.write_text(text)
    return type("ProjectCLI", (TemplateCLI,), {"default_config": config})


def test_a_model_the_arguments_name_starts_from_its_own_defaults(tmp_path):
    cli_class = project_cli(
        tmp_path,
        "model: tests.fixtures.workload.TinyClassifier\ndata: tests.fixtures.workload.TinyData\n"
        "trainer:\n  max_steps: 3\n  logger: false\n",
    )
    default = cli_class(args=[], run=False)
    assert type(default.model).__name__ == "TinyClassifier" and default.trainer.max_steps == 3
    other = cli_class(args=["--model=tests.zoo.regression.Regressor", "--data=tests.zoo.regression.RegressionData"],
                      run=False)  # fmt: skip
    assert type(other.model).__name__ == "Regressor" and other.trainer.max_steps == 3  # the rest of the file stays


def test_a_parser_error_is_one_paragraph_with_the_fix(capsys):
    parser = TemplateArgumentParser(prog="python -m tests.cli")
    parser.add_argument("--steps", type=int)
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(["--steps=many"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and '"steps"' in err and "Fix: correct that option." in err
    assert "Traceback" not in err and "usage:" not in err


def test_an_abbreviated_option_is_refused_not_guessed(capsys):
    parser = TemplateArgumentParser(prog="python -m tests.cli")
    parser.add_argument("--max_epochs", type=int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--max_epoch=3"])
    assert "max_epoch" in capsys.readouterr().err


def test_a_config_file_that_is_no_yaml_is_named_with_its_line(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer:\n  max_steps: [3\n")
    parser = TemplateArgumentParser(prog="python -m tests.cli")
    with pytest.raises(SystemExit):
        parser.parse_args(["--config", str(broken)])
    err = capsys.readouterr().err
    assert f"--config {broken} is not valid YAML at line" in err


def test_an_option_the_arguments_give_is_not_blamed_on_the_default_config(tmp_path, capsys):
    """The subcommand's parser reports a bad ``--model.*`` flag; the key (``model``) is also in the default config,
    but the flag gave it, so the paragraph names the option, not the file."""
    cli_class = project_cli(tmp_path, "model: tests.fixtures.workload.TinyClassifier\n")
    with pytest.raises(SystemExit) as stopped:
        cli_class(args=["fit", "--data=tests.fixtures.workload.TinyData", "--model.no_such_option=1"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "no_such_option" in err
    assert "Fix: correct that option." in err and str(tmp_path / "default.yaml") not in err
