"""The leaderboard (multigpu/sweep/report.py): trials best first, their files, and the best trial's config."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from multigpu.sweep import spec as sweep_spec
from multigpu.sweep.report import report
from multigpu.sweep.study import ERROR_ATTR, PRUNED_ATTR, STEPS_ATTR, Sweep, bind, run_dir
from tests.sweep.conftest import BATCH, LR, write_sweep


def five_trials(tmp_path: Path) -> Path:
    """A sweep's folder with five trials: two complete, two pruned (one before any value), one failed."""
    sweep_dir = tmp_path / "sweep"
    sweep = Sweep(bind(sweep_spec.load(write_sweep(tmp_path, trials=5)), sweep_dir), sweep_dir)
    distributions = {LR: FloatDistribution(1e-3, 1e-1, log=True), BATCH: CategoricalDistribution([16, 32])}

    def add(state: TrialState, value: float | None, lr: float, **attrs: Any) -> None:
        steps = {4: value} if state != TrialState.COMPLETE and value is not None else {}
        trial = create_trial(
            state=state,
            value=value if state == TrialState.COMPLETE else None,
            params={LR: lr, BATCH: 16},
            distributions=distributions,
            user_attrs={STEPS_ATTR: 8, "wall_s": 3.5, **attrs},
            intermediate_values=steps,
        )
        sweep.study.add_trial(trial)

    add(TrialState.COMPLETE, 0.9, 0.01)
    add(TrialState.FAIL, None, 0.02, **{ERROR_ATTR: "exit status 2: error: bad"})
    add(TrialState.COMPLETE, 0.5, 0.03)
    add(TrialState.PRUNED, 1.2, 0.04, **{PRUNED_ATTR: "the pruner stopped it"})
    add(TrialState.PRUNED, None, 0.05, **{PRUNED_ATTR: "the training loss became non-finite (NaN or inf)"})
    return sweep_dir


def test_report_ranks_trials_best_first_and_names_the_best_config(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep_dir = five_trials(tmp_path)
    best = report(sweep_dir, plot_file=False)  # the plot: the next test
    with open(sweep_dir / "leaderboard.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["trial"], r["state"]) for r in rows] == [
        ("2", "complete"),
        ("0", "complete"),
        ("3", "pruned"),
        ("4", "pruned"),
        ("1", "fail"),
    ]
    assert list(rows[0]) == ["trial", "state", "val/loss", LR, BATCH, "steps", "wall_s", "run_dir", "note"]
    assert rows[0]["val/loss"] == "0.5" and rows[0][LR] == "0.03" and rows[0]["steps"] == "8"
    assert rows[0]["run_dir"] == str(run_dir(sweep_dir, 2)) and rows[4]["note"] == "exit status 2: error: bad"
    assert rows[2]["val/loss"] == "1.2" and rows[2]["note"] == "the pruner stopped it"
    assert rows[3]["val/loss"] == "" and rows[3]["note"].startswith("the training loss became non-finite")
    markdown = (sweep_dir / "leaderboard.md").read_text().splitlines()
    assert len(markdown) == 2 + 5 and markdown[2].startswith("| 2 | complete | 0.5 |")
    assert best == run_dir(sweep_dir, 2) / "config.yaml"
    assert capsys.readouterr().out.splitlines()[-1] == f"best trial 2 (val/loss=0.5): {best}"


def test_report_draws_the_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib: pip install -e .[bench]")
    sweep_dir = five_trials(tmp_path)
    assert report(sweep_dir) == run_dir(sweep_dir, 2) / "config.yaml"
    assert (sweep_dir / "leaderboard.png").stat().st_size > 10_000
