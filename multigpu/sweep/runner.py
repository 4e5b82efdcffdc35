"""``python -m multigpu.sweep run``: check everything once, then run K workers here (or one per array task)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from optuna.trial import TrialState

from multigpu.command import module
from multigpu.sweep.spec import SweepError, SweepSpec, flag
from multigpu.sweep.study import Sweep, bind, check_same_sweep, is_sweep_dir, running_elsewhere
from multigpu.sweep.worker import STOPPED, Worker, say


def with_trials(spec: SweepSpec, trials: int | None) -> SweepSpec:
    if trials is None:
        return spec
    if trials < 1:
        raise SweepError(f"--trials {trials}: the number of trials must be positive. Fix: e.g. --trials 20.")
    return dataclasses.replace(spec, trials=trials, raw={**spec.raw, "trials": trials})


def dry_run(spec: SweepSpec, sweep_dir: Path, extra: list[str]) -> dict[str, Any]:
    """The fit config a trial resolves to (``--print_config``): the CLI checks every argument, ``space`` keys too."""
    values = [flag(p.key, p.choices[0] if p.choices is not None else p.low) for p in spec.space]
    command = [sys.executable, "-m", module(), "fit", *spec.fit, *extra, *values]
    command += [f"--trainer.default_root_dir={sweep_dir / 'dry-run'}", "--print_config"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SweepError(
            f"the sweep's fit arguments do not parse (the error above, from `{shlex.join(command[1:])}`). Fix: correct"
            " `fit` or `space` in the sweep file, or the arguments after `--`; nothing was started."
        )
    return yaml.safe_load(result.stdout)


def trial_devices(trainer: dict[str, Any]) -> tuple[str, int, int]:
    """(accelerator, devices one trial uses on this machine, devices the machine has), counted as ``fit`` does."""
    from multigpu.facts import environment

    accelerator = environment.resolve_accelerator(trainer.get("accelerator", "auto"))
    per_trial = environment.requested_devices(trainer.get("devices", "auto"), accelerator) or 1
    return accelerator, per_trial, environment.available_devices(accelerator)


def check_devices(trainer: dict[str, Any], workers: int) -> tuple[str, int]:
    accelerator, per_trial, available = trial_devices(trainer)
    if workers * per_trial > available:
        fits = max(available // per_trial, 1)
        raise SweepError(
            f"--workers {workers} x {per_trial} {accelerator} device(s) per trial (--trainer.devices="
            f"{trainer.get('devices')}) needs {workers * per_trial} devices, and this machine has {available}. Fix:"
            f" --workers {fits}, or fewer devices per trial; on a cluster, one worker per array task"
            " (slurm/sweep.sbatch). Nothing was started."
        )
    return accelerator, per_trial


def summary(sweep: Sweep) -> str:
    counts = Counter(t.state.name.lower() for t in sweep.study.get_trials(deepcopy=False))
    names = {"complete": "complete", "pruned": "pruned", "fail": "failed", "running": "unfinished"}
    parts = [f"{counts[k]} {v}" for k, v in names.items() if counts[k]]
    return f"{sum(counts.values())} of {sweep.total()} trials ({', '.join(parts) or 'none yet'})"


def nothing_to_run(sweep: Sweep) -> bool:
    """Say so and return True when every trial is finished or runs in another live worker."""
    trials = sweep.study.get_trials(deepcopy=False)
    running = [t.number for t in trials if t.state == TrialState.RUNNING]
    abandoned = len(running) - len(running_elsewhere(sweep))
    if len(trials) < sweep.total() or abandoned:
        return False
    if running:
        say(f"{sweep.dir}: {summary(sweep)}; the rest run in other workers, nothing to start here")
    else:
        say(f"{sweep.dir} is complete: {summary(sweep)}; nothing to do (`--trials N` extends it)")
        say(f"leaderboard: python -m multigpu.sweep report {sweep.dir}")
    return True


def run(spec: SweepSpec, sweep_dir: Path, workers: int = 1, extra: list[str] | None = None, launcher: str = "") -> int:
    extra = list(extra or [])
    if workers < 1:
        raise SweepError(f"--workers {workers}: at least one worker. Fix: --workers 1.")
    if is_sweep_dir(sweep_dir):
        check_same_sweep(spec, sweep_dir)
        if nothing_to_run(Sweep(spec, sweep_dir)):
            return 0
    # every check before the directory is written: a mistake leaves nothing behind to refuse the corrected file
    config = dry_run(spec, sweep_dir, extra)
    trainer = config.get("trainer") or {}
    accelerator, per_trial = check_devices(trainer, workers)
    logger = trainer.get("logger")
    sweep = Sweep(bind(spec, sweep_dir), sweep_dir)
    say(f"{sweep_dir}: {summary(sweep)}; {workers} worker(s), {per_trial} {accelerator} device(s) per trial")
    prefix = shlex.split(launcher)
    if workers == 1:
        status = Worker(sweep, extra, prefix, logger, label="worker 0").run()
    else:
        status = _run_workers(spec, sweep_dir, workers, extra, prefix, logger, accelerator, per_trial)
    say(f"{sweep_dir}: {summary(Sweep(spec, sweep_dir))}; leaderboard: python -m multigpu.sweep report {sweep_dir}")
    return status


def _worker_main(
    spec: SweepSpec,
    sweep_dir: Path,
    extra: list[str],
    launcher: list[str],
    logger: Any,
    index: int,
    env: dict[str, str],
) -> None:
    # a fresh study object per process: the journal is re-read from the file, never shared in memory
    worker = Worker(Sweep(spec, sweep_dir), extra, launcher, logger, label=f"worker {index}", env=env, tag_lines=True)
    sys.exit(worker.run())


def _run_workers(
    spec: SweepSpec,
    sweep_dir: Path,
    workers: int,
    extra: list[str],
    launcher: list[str],
    logger: Any,
    accelerator: str,
    per_trial: int,
) -> int:
    """K worker processes, each with its own devices on a GPU machine; stop signals are passed on to them."""
    context = multiprocessing.get_context("spawn")  # no copy of this process's threads or open journal files
    processes = []
    for index in range(workers):
        env: dict[str, str] = {}
        if accelerator == "cuda":
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(workers * per_trial)]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[index * per_trial : (index + 1) * per_trial])
        process = context.Process(
            target=_worker_main, args=(spec, sweep_dir, extra, launcher, logger, index, env), name=f"worker {index}"
        )
        process.start()
        processes.append(process)

    def forward(signum: int, frame: FrameType | None) -> None:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        for process in processes:
            process.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    codes = [p.exitcode or 0 for p in processes]
    stopped = [c for c in codes if c in STOPPED]
    if stopped:
        return stopped[0]
    return next((c for c in codes if c != 0), 0)
