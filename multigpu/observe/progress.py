"""Progress output: a Rich bar on an interactive terminal, plain log lines everywhere else (carriage-return bars
turn SLURM and CI logs into megabytes of redrawn lines, and Lightning has no line-per-interval progress callback)."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar

from multigpu.observe.throughput import shown_figures
from multigpu.steps import EveryNSteps

#: read from ``callback_metrics`` rather than logged with ``prog_bar=True``, which Lightning turns into a number
#: after every batch: a host-device sync per step on a GPU (``scripts/sync_count.py``)
SHOWN_TRAINING_METRICS = ("train/loss",)


class ShownTrainingMetrics:
    """``SHOWN_TRAINING_METRICS`` as numbers, read from the device only on the steps the logger writes."""

    def __init__(self) -> None:
        self._shown: dict[str, float] = {}
        self._step = -1

    def __call__(self, trainer: L.Trainer) -> dict[str, float]:
        step = trainer.global_step
        if step != self._step and (not self._shown or step % max(1, trainer.log_every_n_steps) == 0):
            metrics = trainer.callback_metrics
            self._shown.update({key: float(metrics[key]) for key in SHOWN_TRAINING_METRICS if key in metrics})
            self._step = step if self._shown else -1
        return dict(self._shown)


class PlainProgressBar(ProgressBar):
    """Prints one line every ``every_n_steps`` optimizer steps and one after each validation, on rank 0.

    Args:
        every_n_steps: Optimizer steps between lines.
    """

    def __init__(self, every_n_steps: int = 50) -> None:
        super().__init__()
        self.every_n_steps = every_n_steps
        self._enabled = True
        self._start = 0.0
        self._every = EveryNSteps(every_n_steps)
        self._training_metrics = ShownTrainingMetrics()

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        shown = self._training_metrics(trainer)
        return {**shown, **super().get_metrics(trainer, pl_module), **shown_figures(trainer)}

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self._enabled:
            print(*args, **kwargs, flush=True)

    def _line(self, trainer: L.Trainer, pl_module: L.LightningModule, prefix: str) -> None:
        elapsed = time.perf_counter() - self._start
        metrics = {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k != "v_num"}
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
        # unknown for an iterable dataset without a length
        known = isinstance(total, int) or (isinstance(total, float) and math.isfinite(total))
        position = f"epoch {trainer.current_epoch} step {trainer.global_step}" + (f"/{int(total)}" if known else "")
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        self.print(f"{prefix} {position} [{elapsed:.1f}s] {shown}")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()
        self._every = EveryNSteps(self.every_n_steps, start=trainer.global_step)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._enabled and self._every.due(trainer.global_step):
            self._line(trainer, pl_module, "train")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._enabled and not trainer.sanity_checking and trainer.state.fn == "fit":
            self._line(trainer, pl_module, "val  ")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._enabled:
            self._line(trainer, pl_module, "done ")


class TemplateRichProgressBar(RichProgressBar):
    """Lightning's Rich bar, also showing the training loss and the throughput figures (``SpeedMonitor``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._training_metrics = ShownTrainingMetrics()

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        shown = self._training_metrics(trainer)
        return {**shown, **super().get_metrics(trainer, pl_module), **shown_figures(trainer)}


def progress_bar(mode: str) -> ProgressBar | None:
    """``auto`` (Rich on a terminal, plain otherwise), ``rich``, ``plain``, or ``none``."""
    if mode == "none":
        return None
    if mode == "rich" or (mode == "auto" and sys.stdout.isatty()):
        return TemplateRichProgressBar()
    return PlainProgressBar()
