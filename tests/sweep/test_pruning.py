"""The callback inside every trial's fit run (multigpu/sweep/pruning.py): the objective must be logged, a non-finite one
prunes without reaching the sampler; slow, ddp trials on 2 CPU processes prune on both ranks at the same step."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from optuna.trial import TrialState

from multigpu.sweep import spec as sweep_spec
from multigpu.sweep.pruning import SweepPruning
from multigpu.sweep.study import PRUNED_ATTR, Sweep, run_dir
from tests.sweep.conftest import BATCH, FIT, LR, MAX_STEPS, sweep_cli, write_sweep


def _trainer(metrics: dict[str, Any], step: int = 4) -> SimpleNamespace:
    return SimpleNamespace(
        sanity_checking=False,
        callback_metrics=metrics,
        is_global_zero=True,
        global_step=step,
        strategy=SimpleNamespace(broadcast=lambda obj, src=0: obj),
        should_stop=False,
    )


def test_objective_not_logged_fails_naming_the_logged_metrics() -> None:
    from multigpu.errors import ConfigurationError

    callback = SweepPruning(monitor="val/los")
    with pytest.raises(ConfigurationError) as error:
        callback.on_validation_end(_trainer({"val/loss": torch.tensor(0.5), "val/acc": torch.tensor(0.7)}), None)
    assert "objective val/los is not logged at validation (logged: val/acc, val/loss). Fix:" in str(error.value)


def test_non_finite_objective_prunes_without_reporting(capsys: pytest.CaptureFixture) -> None:
    class Trial:
        reported: list[tuple[float, int]] = []

        def report(self, value: float, step: int) -> None:
            self.reported.append((value, step))

        def should_prune(self) -> bool:
            return False

    callback = SweepPruning()
    callback.trial = Trial()
    finite = _trainer({"val/loss": torch.tensor(0.5)})
    callback.on_validation_end(finite, None)
    assert not finite.should_stop and callback.trial.reported == [(0.5, 4)]
    diverged = _trainer({"val/loss": torch.tensor(float("nan"))}, step=8)
    callback.on_validation_end(diverged, None)
    assert diverged.should_stop and callback.trial.reported == [(0.5, 4)]  # NaN never reaches the sampler
    assert "trial pruned: val/loss was nan at step 8" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.extended
def test_ddp_trials_see_one_set_of_values_and_prune_together(tmp_path: Path) -> None:
    """Two ddp trials on 2 CPU processes: each rank trains with the values the worker asked for once; the trial
    with a tiny learning rate is pruned at its first validation, on both ranks at the same step."""
    path = write_sweep(
        tmp_path,
        fit=[
            *FIT,
            "--trainer.strategy=ddp",
            "--trainer.devices=2",
            "--trainer.callbacks+=tests.fixtures.sweep_probes.RankView",
        ],
        sampler={"name": "grid", "seed": 0},
        pruner={"name": "threshold", "upper": 1.2},
        space={LR: {"choices": [1.0e-5, 0.05]}, BATCH: {"choices": [32]}},
        trials=2,
    )
    sweep_dir = tmp_path / "sweep"
    result = sweep_cli("run", str(path), "--dir", str(sweep_dir), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    trials = {t.params[LR]: t for t in Sweep(sweep_spec.load(path), sweep_dir).study.get_trials()}
    assert set(trials) == {1.0e-5, 0.05}
    for lr, trial in trials.items():
        folder = run_dir(sweep_dir, trial.number)
        views = [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]
        assert views[0]["world_size"] == 2
        assert views[0] == views[1]  # the same values and the same stopping step on both ranks
        assert (views[0]["lr"], views[0]["batch_size"]) == (lr, 32)
    slow, fast = trials[1.0e-5], trials[0.05]
    assert slow.state == TrialState.PRUNED and slow.intermediate_values[4] > 1.2
    assert json.loads((run_dir(sweep_dir, slow.number) / "rank1.json").read_text())["global_step"] == 4
    assert "the pruner stopped it" in slow.user_attrs[PRUNED_ATTR]
    assert fast.state == TrialState.COMPLETE and fast.value < 1.2
    assert json.loads((run_dir(sweep_dir, fast.number) / "rank1.json").read_text())["global_step"] == MAX_STEPS
