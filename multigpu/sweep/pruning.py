"""The callback inside every trial's fit run: report the objective at each validation, prune once for all ranks.

The trial is named in the environment, which every rank inherits; only rank 0 opens the journal, and its answer is
broadcast so every rank stops at the same step. A non-finite value prunes without being reported to the sampler."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import SaveConfigCallback

from multigpu.errors import ConfigurationError, notice

DIR_ENV, TRIAL_ENV = "SWEEP_DIR", "SWEEP_TRIAL"
CONFIG_FILE = "config.yaml"


class SweepPruning(Callback):
    """Report ``monitor`` after each validation to the sweep's trial and stop when the pruner says so."""

    def __init__(self, monitor: str = "val/loss") -> None:
        self.monitor = monitor
        self.trial: Any = None
        self.sweep: Any = None
        self.number: int | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        run_dir = Path(trainer.default_root_dir)
        _save_reproducible_config(trainer, run_dir / CONFIG_FILE)
        sweep_dir, number = os.environ.get(DIR_ENV), os.environ.get(TRIAL_ENV)
        if not sweep_dir or number is None:
            return
        import optuna

        from multigpu.sweep.study import Sweep, load_spec

        self.number = int(number)
        self.sweep = Sweep(load_spec(Path(sweep_dir)), Path(sweep_dir))
        self.trial = optuna.trial.Trial(self.sweep.study, self.sweep.trial_id(self.number))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:  # the same keys on every rank: each one stops with the same message
            logged = ", ".join(sorted(metrics)) or "none"
            raise ConfigurationError(
                f"the sweep's objective {self.monitor} is not logged at validation (logged: {logged}). Fix: set"
                " objective: {metric: <one of those>} in the sweep file, or log it from the model's validation."
            )
        prune, reason = False, ""
        if trainer.is_global_zero:
            value = float(metrics[self.monitor])
            step = trainer.global_step
            if not math.isfinite(value):
                prune, reason = True, f"{self.monitor} was {value} at step {step}"
            elif self.trial is not None:
                self.trial.report(value, step)
                if self.trial.should_prune():
                    prune, reason = True, f"{self.monitor}={value:.6g} at step {step}: the pruner stopped it"
            self._record(step, reason if prune else None)
        if trainer.strategy.broadcast(prune, src=0):
            trainer.should_stop = True
            if trainer.is_global_zero:
                notice(f"trial pruned: {reason}")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self._record(trainer.global_step, None)

    def _record(self, step: int, pruned_because: str | None) -> None:
        if self.sweep is None or self.number is None:
            return
        from multigpu.sweep.study import PRUNED_ATTR, STEPS_ATTR

        self.sweep.set_attr(self.number, STEPS_ATTR, step)
        if pruned_because:
            self.sweep.set_attr(self.number, PRUNED_ATTR, pruned_because)


def _save_reproducible_config(trainer: L.Trainer, path: Path) -> None:
    """Write the run's resolved config once, without ``ckpt_path``: ``fit --config`` it to train the trial again."""
    if path.exists():
        return
    saver = next((c for c in trainer.callbacks if isinstance(c, SaveConfigCallback)), None)
    if saver is None:
        return
    config = saver.config.clone()
    if "ckpt_path" in config:
        config["ckpt_path"] = None
    # the saved config holds this run directory's own values (loggers' save_dir, the wandb id): reset them so a
    # rerun in another directory neither writes into this one nor continues its wandb run
    logger = config.trainer.get("logger")
    for entry in logger if isinstance(logger, list) else [logger]:
        init_args = getattr(entry, "init_args", None)
        if init_args is None:
            continue
        if str(init_args.get("save_dir")) == str(trainer.default_root_dir):
            init_args["save_dir"] = ""
        if str(entry.get("class_path", "")).endswith("WandbLogger"):
            init_args["id"] = None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(saver.parser.dump(config, skip_none=False))
