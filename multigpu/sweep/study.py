"""The sweep directory's Optuna study (a journal file, safe on a shared file system), and claiming trials.

A worker holds a ``flock`` on ``DIR/locks/<trial>.lock`` while its trial runs, which the OS drops however the process
ends: a running trial whose lock nobody holds was stopped, and the next worker resumes it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from multigpu.sweep.spec import SweepError, SweepSpec, parse

JOURNAL = "journal.log"
SPEC_COPY = "sweep.yaml"
LOCKS = "locks"
RUN_DIR_ATTR, STARTS_ATTR, WALL_ATTR, STEPS_ATTR = "run_dir", "starts", "wall_s", "steps"
ERROR_ATTR, PRUNED_ATTR, STOPPED_ATTR = "error", "pruned_because", "stopped_by"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

optuna.logging.set_verbosity(optuna.logging.WARNING)  # a sweep prints its own lines, one per trial


def run_dir(sweep_dir: Path, number: int) -> Path:
    return sweep_dir / f"trial-{number:04d}"


def study_name(spec: SweepSpec, sweep_dir: Path) -> str:
    """The study's name, also the wandb group."""
    return spec.name or sweep_dir.resolve().name


def storage(sweep_dir: Path) -> JournalStorage:
    return JournalStorage(JournalFileBackend(str(sweep_dir / JOURNAL)))


def is_sweep_dir(sweep_dir: Path) -> bool:
    return (sweep_dir / SPEC_COPY).is_file()


def check_same_sweep(spec: SweepSpec, sweep_dir: Path) -> None:
    """Refuse a sweep file other than the one DIR was started with, but for ``trials``."""
    copy = sweep_dir / SPEC_COPY
    if not copy.is_file():
        return
    kept = parse(yaml.safe_load(copy.read_text()), copy)
    if kept.identity() != spec.identity():
        keys = set(kept.identity()) | set(spec.identity())
        changed = sorted(k for k in keys if kept.raw.get(k) != spec.raw.get(k))
        raise SweepError(
            f"{sweep_dir} holds a sweep of another sweep file ({', '.join(changed)} differ from {copy}). Fix:"
            f" start it in a new --dir, or run {copy} itself (only `trials` may change, to extend a sweep)."
        )


def bind(spec: SweepSpec, sweep_dir: Path) -> SweepSpec:
    """Keep the sweep file in DIR, where the fit runs' pruning callbacks and ``report`` read it."""
    check_same_sweep(spec, sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    copy = sweep_dir / SPEC_COPY
    if not copy.is_file() or yaml.safe_load(copy.read_text()).get("trials") != spec.raw.get("trials"):
        # written whole and renamed: array tasks starting together bind at once, and fit runs read the copy
        partial = copy.with_name(f"{SPEC_COPY}.{os.getpid()}.tmp")
        partial.write_text(yaml.safe_dump(spec.raw, sort_keys=False))
        os.replace(partial, copy)
    return spec


def load_spec(sweep_dir: Path) -> SweepSpec:
    copy = sweep_dir / SPEC_COPY
    if not copy.is_file():
        raise SweepError(f"{sweep_dir} is not a sweep directory (no {SPEC_COPY}). Fix: pass the --dir of a sweep.")
    return parse(yaml.safe_load(copy.read_text()), copy)


class Sweep:
    """The study of a sweep directory, with its storage (whose public methods reach any trial)."""

    def __init__(self, spec: SweepSpec, sweep_dir: Path) -> None:
        self.spec, self.dir = spec, sweep_dir
        self.storage = storage(sweep_dir)
        self.study = optuna.create_study(
            study_name=study_name(spec, sweep_dir),
            storage=self.storage,
            sampler=spec.build_sampler(),
            pruner=spec.build_pruner(),
            direction=spec.direction,
            load_if_exists=True,
        )
        self.study_id = self.storage.get_study_id_from_name(self.study.study_name)

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def set_attr(self, number: int, key: str, value: Any) -> None:
        self.storage.set_trial_user_attr(self.trial_id(number), key, value)

    def trial(self, number: int) -> FrozenTrial:
        return self.storage.get_trial(self.trial_id(number))

    def total(self) -> int:
        size = self.spec.grid_size()
        return self.spec.trials if size is None else min(self.spec.trials, size)


@dataclass
class Claim:
    """A trial this worker runs, with the lock that keeps other workers off it."""

    trial: FrozenTrial
    resumed: bool
    lock_fd: int

    def release(self) -> None:
        os.close(self.lock_fd)


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def _claim_lock(sweep_dir: Path) -> Iterator[None]:
    fd = os.open(sweep_dir / LOCKS / "claim.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for milliseconds: a journal read and at most one ask
        yield
    finally:
        os.close(fd)


def claim(sweep: Sweep) -> Claim | None:
    """An abandoned running trial (resumed), else a new one while there are fewer than ``total``; else None."""
    locks = sweep.dir / LOCKS
    locks.mkdir(exist_ok=True)
    with _claim_lock(sweep.dir):
        trials = sweep.study.get_trials(deepcopy=False)
        for trial in trials:
            if trial.state == TrialState.RUNNING:
                fd = _try_lock(locks / f"{trial.number}.lock")
                if fd is None:
                    continue  # its worker runs it
                # a worker records its trial's end before it lets go of the lock: read the state again now that
                # the lock is ours, or a trial that ended between the read above and the lock would run twice
                if sweep.trial(trial.number).state == TrialState.RUNNING:
                    return Claim(trial, resumed=True, lock_fd=fd)
                os.close(fd)
        if len(trials) >= sweep.total():
            return None
        # every ask happens under this lock, so the next trial's number is the count so far
        sweep.study.sampler = sweep.spec.build_sampler(trial_number=len(trials))
        asked = sweep.study.ask()
        for param in sweep.spec.space:
            param.suggest(asked)
        fd = _try_lock(locks / f"{asked.number}.lock")
        assert fd is not None, "a new trial's lock is free: every claim is made under the claim lock"
        sweep.set_attr(asked.number, RUN_DIR_ATTR, str(run_dir(sweep.dir, asked.number)))
        return Claim(sweep.trial(asked.number), resumed=False, lock_fd=fd)


def running_elsewhere(sweep: Sweep) -> list[int]:
    held = []
    (sweep.dir / LOCKS).mkdir(exist_ok=True)
    for trial in sweep.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        fd = _try_lock(sweep.dir / LOCKS / f"{trial.number}.lock")
        if fd is None:
            held.append(trial.number)
        else:
            os.close(fd)
    return held
