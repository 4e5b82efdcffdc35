"""``python -m multigpu.sweep`` (multigpu/sweep/__main__.py): arguments after ``--`` kept for fit, and a mistake
reported as one
paragraph with its exit status. Each module of multigpu/sweep/ has its own test beside this one (``test_spec.py``,
``test_study.py``, ``test_runner.py``, ``test_worker.py``, ``test_pruning.py``, ``test_report.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multigpu.sweep.__main__ import main as sweep_main
from tests.sweep.conftest import write_sweep


def test_a_mistake_is_one_paragraph_with_exit_status_2_and_arguments_after_the_separator_go_to_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert sweep_main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path} is not a sweep directory (no sweep.yaml). Fix: pass the --dir of a sweep.\n"
    )
    sweep_dir = tmp_path / "sweep"
    # `--trials 0` is the command's own; the `--trials 3` after `--` belongs to fit, so it does not replace it
    args = ["run", str(write_sweep(tmp_path)), "--dir", str(sweep_dir), "--trials", "0", "--", "--trials", "3"]
    assert sweep_main(args) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --trials 0: the number of trials must be positive. Fix:") and error.count("\n") == 1
    assert not sweep_dir.exists()  # nothing written
