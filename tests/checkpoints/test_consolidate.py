"""``python -m multigpu.consolidate DIR OUT.ckpt`` (multigpu/checkpoints/consolidate.py): a folder that is no sharded
checkpoint is refused; the usage names the program that runs. The consolidation of a trained fsdp2 run is tested in
tests/strategies/test_model_parallel.py, on that module's shared runs."""

from __future__ import annotations

import sys

import pytest

from multigpu.checkpoints.consolidate import main as consolidate_main
from tests import prewarmed
from tests.conftest import REPO, cli_env


def test_consolidate_refuses_a_folder_that_is_no_checkpoint(tmp_path, capsys):
    assert consolidate_main([str(tmp_path), str(tmp_path / "out.ckpt")]) == 2
    error = capsys.readouterr().err
    assert "not a complete sharded checkpoint" in error and "Fix:" in error
    assert not (tmp_path / "out.ckpt").exists()


def test_the_usage_names_the_program_that_runs_not_a_project(tmp_path):
    for module in ("multigpu.consolidate", "multigpu.checkpoints.consolidate"):  # one main, run under two names
        command = [sys.executable, "-m", module, str(tmp_path)]  # OUTPUT missing: the usage and status 2
        done = prewarmed.run(command, cwd=REPO, env=cli_env(), capture_output=True)
        assert done.returncode == 2 and done.stderr.decode().startswith(f"usage: python -m {module} ")


def test_called_from_python_the_usage_names_the_engines_command(capsys):
    with pytest.raises(SystemExit):
        consolidate_main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m multigpu.consolidate ")
