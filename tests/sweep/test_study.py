"""The sweep directory's study (multigpu/sweep/study.py): a directory keeps its sweep, workers share one journal and
never
run a trial twice, a stopped trial is resumed, more trials extend a sweep, a grid ends with its points."""

from __future__ import annotations

import json
import multiprocessing
import threading
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from multigpu.sweep import spec as sweep_spec
from multigpu.sweep import study as study_module
from multigpu.sweep.__main__ import main as sweep_main
from multigpu.sweep.runner import with_trials
from multigpu.sweep.study import LOCKS, Sweep, bind, claim
from tests.sweep.conftest import BATCH, LR, write_sweep


def test_a_directory_keeps_its_sweep(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep_dir = tmp_path / "sweep"
    bind(sweep_spec.load(write_sweep(tmp_path)), sweep_dir)
    bind(sweep_spec.load(write_sweep(tmp_path, trials=5)), sweep_dir)  # more trials: the same sweep, extended
    assert yaml.safe_load((sweep_dir / "sweep.yaml").read_text())["trials"] == 5
    other = write_sweep(tmp_path, objective={"metric": "val/acc", "mode": "max"})
    assert sweep_main(["run", str(other), "--dir", str(sweep_dir)]) == 2
    error = capsys.readouterr().err
    assert (
        f"{sweep_dir} holds a sweep of another sweep file (objective differ" in error
        and "Fix: start it in a new" in error
    )


def _claim_all(path: str, sweep_dir: str, out: str, together: threading.Barrier) -> None:
    """A worker without fit runs: claim trials until none is left, complete each, write down their numbers. Each
    worker holds its first trial until every worker holds one: the later claims meet trials that others run."""
    sweep = Sweep(sweep_spec.load(path), Path(sweep_dir))
    numbers = []
    while (claimed := claim(sweep)) is not None:
        numbers.append(claimed.trial.number)
        if len(numbers) == 1:
            together.wait(timeout=60)
        sweep.study.tell(claimed.trial.number, claimed.trial.params[LR])
        claimed.release()
    Path(out).write_text(json.dumps(numbers))


def test_workers_share_one_journal_and_never_run_a_trial_twice(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, trials=12)
    sweep_dir = tmp_path / "sweep"
    bind(sweep_spec.load(path), sweep_dir)
    context = multiprocessing.get_context("fork")  # separate processes, each with its own view of the journal
    outs = [tmp_path / f"worker{i}.json" for i in range(3)]
    together = context.Barrier(len(outs))
    workers = [context.Process(target=_claim_all, args=(str(path), str(sweep_dir), str(o), together)) for o in outs]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    claimed = [n for o in outs for n in json.loads(o.read_text())]
    assert sorted(claimed) == list(range(12))  # every trial once, none twice
    study = Sweep(sweep_spec.load(path), sweep_dir).study
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 12
    assert len({t.params[LR] for t in trials}) == 12  # the workers drew different values, though seeded alike


def test_a_trial_that_ends_while_another_worker_claims_is_not_run_again(tmp_path: Path, monkeypatch) -> None:
    """The owner records the end of its trial, then lets go of its lock; a worker that read the trial as running
    just before takes the lock just after, and must see that the trial ended."""
    path = write_sweep(tmp_path, trials=3)
    sweep_dir = tmp_path / "sweep"
    sweep = Sweep(bind(sweep_spec.load(path), sweep_dir), sweep_dir)
    owner = claim(sweep)
    assert owner is not None and owner.trial.number == 0
    try_lock = study_module._try_lock

    def owner_ends_first(lock: Path) -> int | None:
        if lock.name == "0.lock" and owner.lock_fd >= 0:  # between the other worker's read and its lock
            Sweep(sweep_spec.load(path), sweep_dir).study.tell(0, 0.5)
            owner.release()
            owner.lock_fd = -1
        return try_lock(lock)

    monkeypatch.setattr(study_module, "_try_lock", owner_ends_first)
    other = claim(Sweep(sweep_spec.load(path), sweep_dir))
    assert other is not None and not other.resumed and other.trial.number == 1  # a new trial, not trial 0 again


def test_a_stopped_trial_is_resumed_and_a_held_one_is_not(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, trials=3)
    sweep_dir = tmp_path / "sweep"
    sweep = Sweep(bind(sweep_spec.load(path), sweep_dir), sweep_dir)
    first, second = claim(sweep), claim(sweep)
    assert first and second and (first.trial.number, second.trial.number) == (0, 1)
    first.release()  # its worker stopped (a signal, a kill): trial 0 is running, and nobody holds it
    resumed = claim(sweep)
    assert resumed and resumed.resumed and resumed.trial.number == 0
    assert resumed.trial.params == first.trial.params  # the same values, not a new draw
    third = claim(sweep)  # trial 1 is held by its live worker: not taken, a new trial instead
    assert third and not third.resumed and third.trial.number == 2
    assert claim(sweep) is None  # three trials exist and each is held


def test_more_trials_extend_a_finished_sweep(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, trials=2)
    sweep_dir = tmp_path / "sweep"
    sweep = Sweep(bind(sweep_spec.load(path), sweep_dir), sweep_dir)
    for _ in range(2):
        claimed = claim(sweep)
        assert claimed is not None
        sweep.study.tell(claimed.trial.number, 0.5)
        claimed.release()
    assert claim(sweep) is None  # complete
    extended = with_trials(sweep_spec.load(path), 3)  # run --trials 3
    sweep = Sweep(bind(extended, sweep_dir), sweep_dir)
    claimed = claim(sweep)
    assert claimed is not None and claimed.trial.number == 2 and not claimed.resumed
    assert claim(sweep) is None
    assert sorted(p.name for p in (sweep_dir / LOCKS).iterdir()) == ["0.lock", "1.lock", "2.lock", "claim.lock"]


def test_a_grid_gives_each_trial_its_own_point_and_ends_with_the_grid(tmp_path: Path) -> None:
    path = write_sweep(
        tmp_path, trials=50, sampler={"name": "grid", "seed": 3}, space={BATCH: {"choices": [8, 16, 32]}}
    )
    sweep_dir = tmp_path / "sweep"
    sweep = Sweep(bind(sweep_spec.load(path), sweep_dir), sweep_dir)
    claims = [claim(sweep) for _ in range(3)]
    assert sorted(c.trial.params[BATCH] for c in claims if c) == [8, 16, 32]
    assert sweep.total() == 3 and claim(sweep) is None
