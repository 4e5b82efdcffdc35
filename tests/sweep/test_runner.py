"""``python -m multigpu.sweep run``'s checks before anything starts (multigpu/sweep/runner.py): the CLI's own check of
the
sweep's fit arguments (a dry run), and workers that would share devices."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from multigpu.sweep import spec as sweep_spec
from multigpu.sweep.runner import check_devices
from tests.sweep.conftest import sweep_cli, write_sweep


def test_misspelt_searched_option_is_refused_by_the_cli_before_anything_starts(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, space={"model.init_args.optimizer.init_args.lrr": {"low": 0.001, "high": 0.1}})
    sweep_dir = tmp_path / "sweep"
    result = sweep_cli("run", str(path), "--dir", str(sweep_dir))
    assert result.returncode == 2
    assert "Option 'lrr' is not accepted" in result.stderr  # the CLI's own message, with its fix
    assert "error: the sweep's fit arguments do not parse (the error above" in result.stderr
    assert "Fix: correct `fit` or `space` in the sweep file" in result.stderr
    assert not sweep_dir.exists()  # nothing written: the corrected file starts afresh in the same --dir


def test_more_workers_than_devices_is_refused() -> None:
    cpus = os.cpu_count() or 1
    assert check_devices({"accelerator": "cpu", "devices": 1}, workers=cpus) == ("cpu", 1)
    with pytest.raises(sweep_spec.SweepError) as refused:
        check_devices({"accelerator": "cpu", "devices": 2}, workers=cpus)
    message = str(refused.value)
    assert f"--workers {cpus} x 2 cpu device(s) per trial (--trainer.devices=2) needs {2 * cpus} devices" in message
    assert f"Fix: --workers {max(cpus // 2, 1)}, or fewer devices per trial" in message
