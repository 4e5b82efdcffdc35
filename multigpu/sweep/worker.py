"""One sweep worker: claim a trial, run its ``fit`` with the trial's values as flags (so every rank of a
multi-process trial reads the same values), record how it ended; repeat. docs/sweeps.md, "What survives what"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from optuna.trial import TrialState

from multigpu.command import module
from multigpu.sweep.spec import flag
from multigpu.sweep.study import (
    ERROR_ATTR,
    PRUNED_ATTR,
    STARTS_ATTR,
    STOPPED_ATTR,
    WALL_ATTR,
    Claim,
    Sweep,
    claim,
    run_dir,
    running_elsewhere,
)

STOPPED = {75: "preempted (SIGUSR1)", 143: "stopped by SIGTERM", 130: "stopped by SIGINT"}
NON_FINITE_LOSS = 65  # multigpu/faults/nan_guard.py
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
SIGNAL_EXIT = {signal.SIGUSR1: 75, signal.SIGTERM: 143, signal.SIGINT: 130}
ERROR_LINES = 12  # of the run's output, kept as a failed trial's message when it printed no "error:" line
CALLBACK = "multigpu.sweep.pruning.SweepPruning"


def say(message: str) -> None:
    print(f"sweep: {message}", flush=True)


def logger_flags(logger: Any, group: str, name: str) -> list[str]:
    """``--trainer.logger=...`` naming a wandb logger's group and run after the sweep and trial, or nothing."""
    entries = logger if isinstance(logger, list) else [logger]
    if not any(isinstance(e, dict) and str(e.get("class_path", "")).endswith("WandbLogger") for e in entries):
        return []
    updated = []
    for entry in entries:
        if isinstance(entry, dict) and str(entry.get("class_path", "")).endswith("WandbLogger"):
            entry = {**entry, "init_args": {**(entry.get("init_args") or {}), "group": group, "name": name}}
        updated.append(entry)
    return [f"--trainer.logger={json.dumps(updated if isinstance(logger, list) else updated[0])}"]


class Worker:
    """Runs trials until none is left or a signal stops it.

    ``launcher`` prefixes every fit command (``srun ...``); ``logger`` is the fit runs' resolved ``trainer.logger``;
    ``env`` adds to their environment (the devices they may use); ``tag_lines`` prefixes their output with the trial.
    """

    def __init__(
        self,
        sweep: Sweep,
        extra: Sequence[str] = (),
        launcher: Sequence[str] = (),
        logger: Any = None,
        label: str = "worker",
        env: dict[str, str] | None = None,
        tag_lines: bool = False,
    ) -> None:
        self.sweep = sweep
        self.extra = list(extra)
        self.launcher = list(launcher)
        self.logger = logger
        self.label = label
        self.env = env or {}
        self.tag_lines = tag_lines
        self.stop_signal: int | None = None
        self.child: subprocess.Popen | None = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # the fit run saves and stops on the same signal; this worker waits for it, records it, and stops
        self.stop_signal = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def install_signal_handlers(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)

    def run(self) -> int:
        """Run trials; return 0 when none is left, or the stop status (75, 130, 143) after a signal."""
        self.install_signal_handlers()
        while self.stop_signal is None:
            claimed = claim(self.sweep)
            if claimed is None:
                elsewhere = running_elsewhere(self.sweep)
                tail = f"; trial(s) {', '.join(map(str, elsewhere))} still run in other workers" if elsewhere else ""
                say(f"{self.label}: no trial left to run{tail}")
                return 0
            try:
                status = self.run_trial(claimed)
            finally:
                claimed.release()
            if status is not None:
                return status
        return SIGNAL_EXIT[signal.Signals(self.stop_signal)]

    def command(self, claimed: Claim) -> list[str]:
        trial = claimed.trial
        folder = run_dir(self.sweep.dir, trial.number)
        callback = {"class_path": CALLBACK, "init_args": {"monitor": self.sweep.spec.metric}}
        group = self.sweep.study.study_name
        args = [
            *self.launcher,
            sys.executable,
            "-m",
            module(),
            "fit",
            *self.sweep.spec.fit,
            *self.extra,
            *(flag(p.key, trial.params[p.key]) for p in self.sweep.spec.space),
            f"--trainer.default_root_dir={folder}",
            f"--trainer.callbacks+={json.dumps(callback)}",
            *logger_flags(self.logger, group, f"{group}-{folder.name}"),
        ]
        if any((folder / "checkpoints").glob("*.ckpt")):
            args.append("--ckpt_path=last")
        return args

    def run_trial(self, claimed: Claim) -> int | None:
        """Run one trial's fit; None to go on, or the status to stop with."""
        trial, sweep = claimed.trial, self.sweep
        number = trial.number
        folder = run_dir(sweep.dir, number)
        folder.mkdir(parents=True, exist_ok=True)
        values = " ".join(f"{p.key.rsplit('.', 1)[-1]}={trial.params[p.key]}" for p in sweep.spec.space)
        starts = int(trial.user_attrs.get(STARTS_ATTR, 0)) + 1
        sweep.set_attr(number, STARTS_ATTR, starts)
        say(f"{self.label}: trial {number} {'resumed' if claimed.resumed else 'started'} ({values}) in {folder}")
        env = {**os.environ, **self.env, "SWEEP_DIR": str(sweep.dir), "SWEEP_TRIAL": str(number)}
        began = time.monotonic()
        tail: list[str] = []
        with open(folder / "fit.log", "a") as log:
            # the run holds the trial's lock too (an inherited descriptor of the same lock): a worker killed
            # outright cannot free its trial for another worker while its run still trains
            self.child = subprocess.Popen(
                self.command(claimed),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                pass_fds=(claimed.lock_fd,),
            )
            if self.stop_signal is not None:  # a signal that came while the run was starting
                self.child.send_signal(self.stop_signal)
            assert self.child.stdout is not None
            for line in self.child.stdout:
                sys.stdout.write(f"[trial {number}] {line}" if self.tag_lines else line)
                log.write(line)
                tail = [*tail[-(ERROR_LINES * 4) :], line.rstrip()]
            status = self.child.wait()
            self.child = None
        sys.stdout.flush()
        seconds = float(trial.user_attrs.get(WALL_ATTR, 0.0)) + time.monotonic() - began
        sweep.set_attr(number, WALL_ATTR, round(seconds, 2))
        return self.record(number, status, tail)

    def tell(self, number: int, value: float | None = None, state: TrialState | None = None) -> None:
        try:
            self.sweep.study.tell(number, value, state=state)
        except RuntimeError as error:
            # GridSampler.after_trial calls Study.stop(), valid only inside Study.optimize, after the result is
            # stored; a sweep stops by counting its trials instead
            if self.sweep.spec.sampler["name"] != "grid" or "Study.stop" not in str(error):
                raise

    def record(self, number: int, status: int, tail: list[str]) -> int | None:
        sweep = self.sweep
        if status in STOPPED or (status < 0 and self.stop_signal is not None):
            how = STOPPED.get(status, f"killed by signal {-status}")
            sweep.set_attr(number, STOPPED_ATTR, how)
            say(f"{self.label}: trial {number} {how}; the next `run` resumes it from its last.ckpt")
            return status if status in STOPPED else SIGNAL_EXIT.get(signal.Signals(self.stop_signal or 15), 143)
        trial = sweep.trial(number)
        if status == 0 and PRUNED_ATTR in trial.user_attrs:
            self.tell(number, state=TrialState.PRUNED)
            say(f"{self.label}: trial {number} pruned: {trial.user_attrs[PRUNED_ATTR]}")
        elif status == 0 and trial.intermediate_values:
            value = trial.intermediate_values[max(trial.intermediate_values)]
            self.tell(number, value)
            say(f"{self.label}: trial {number} complete: {sweep.spec.metric}={value:.6g}")
        elif status == NON_FINITE_LOSS:
            sweep.set_attr(number, PRUNED_ATTR, "the training loss became non-finite (NaN or inf)")
            self.tell(number, state=TrialState.PRUNED)
            say(f"{self.label}: trial {number} pruned: its training loss became non-finite")
        else:
            if status == 0:
                message = (
                    f"the run ended without a validation, so {sweep.spec.metric} was never reported. Fix: validate"
                    " at least once (--trainer.check_val_every_n_epoch, --trainer.val_check_interval)."
                )
            else:
                errors = [line for line in tail if line.startswith(("error:", "stopped:"))]
                message = f"exit status {status}: " + " ".join(errors[-1:] or tail[-ERROR_LINES:])
            sweep.set_attr(number, ERROR_ATTR, message)
            self.tell(number, state=TrialState.FAIL)
            say(f"{self.label}: trial {number} failed ({message}); it is not retried")
        return None
