"""The sweep file (multigpu/sweep/spec.py): its checks, each one paragraph naming the key and the fix, and its values as
fit flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from multigpu.sweep import spec as sweep_spec
from multigpu.sweep.__main__ import main as sweep_main
from tests.sweep.conftest import BATCH, LR, write_sweep


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"sampler": {"name": "tpx"}}, "sampler: unknown name 'tpx' (did you mean 'tpe'?). Fix: use one of tpe,"),
        ({"samplr": {"name": "tpe"}}, "unknown key 'samplr' (did you mean 'sampler'?). Fix: use only fit,"),
        ({"pruner": {"name": "medain"}}, "pruner: unknown name 'medain' (did you mean 'median'?)"),
        ({"space": {LR: {"low": 0.1, "high": 0.01}}}, f"space: {LR}: low (0.1) must be below high (0.01)"),
        ({"space": {LR: {"low": 0.1, "hgih": 1.0}}}, f"space: {LR}: unknown key 'hgih'. Fix: a range takes low,"),
        ({"space": {LR: {"low": 0.0, "high": 1.0, "log": True}}}, "a log range needs low > 0 (got 0.0)"),
        ({"space": {LR: [0.1, 0.01]}}, f"space: {LR} is [0.1, 0.01]. Fix: a range {{low:"),
        ({"space": {BATCH: {"choices": []}}}, f"space: {BATCH}: choices must be a non-empty list"),
        ({"objective": {"metric": "val/loss", "mode": "lowest"}}, "objective: mode: 'lowest' is neither min nor max"),
        ({"trials": 0}, "trials: 0 is not a positive whole number"),
        ({"fit": None}, "`fit` is missing. Fix: add it"),
        ({"sampler": {"name": "grid"}}, f"space: {LR} is a continuous range, which a grid cannot walk. Fix:"),
        ({"sampler": {"name": "tpe", "n_startup": 3}}, "sampler: TPESampler does not accept {'n_startup': 3}"),
    ],
)
def test_bad_sweep_file_is_one_paragraph_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture, overrides: dict[str, Any], expected: str
) -> None:
    path = write_sweep(tmp_path, **overrides)
    sweep_dir = tmp_path / "sweep"
    assert sweep_main(["run", str(path), "--dir", str(sweep_dir)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and expected in error, error
    assert "Fix" in error and error.count("\n") == 1  # one paragraph
    assert not sweep_dir.exists()  # nothing written


def test_sweep_file_values_become_fit_flags(tmp_path: Path) -> None:
    spec = sweep_spec.load(write_sweep(tmp_path, space={BATCH: {"low": 16, "high": 64, "step": 16}}))
    assert spec.space[0].grid() == [16, 32, 48, 64] and spec.space[0].is_int
    assert not sweep_spec.Param("model.init_args.dropout", low=0, high=1).is_int  # no step: a float range
    logs = sweep_spec.load(
        write_sweep(tmp_path, space={"model.init_args.hidden": {"low": 8, "high": 64, "step": 1, "log": True}})
    )
    assert logs.space[0].is_int and logs.space[0].log
    assert sweep_spec.flag(LR, 0.003) == f"--{LR}=0.003"
    assert sweep_spec.flag("trainer.gradient_clip_val", None) == "--trainer.gradient_clip_val=null"
    assert sweep_spec.flag("model.init_args.compile", True) == "--model.init_args.compile=true"
    grid = sweep_spec.load(
        write_sweep(tmp_path, sampler={"name": "grid"}, trials=50, space={BATCH: {"choices": [8, 16]}})
    )
    assert grid.grid_size() == 2
