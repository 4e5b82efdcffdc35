"""Progress output: a Rich bar on an interactive terminal, plain log lines everywhere else.

Carriage-return progress bars (tqdm, Rich) turn SLURM and CI logs into megabytes of redrawn lines. The plain
bar is written by hand because Lightning has no line-per-interval progress callback.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar

from multigpu.callbacks.steps import EveryNSteps
from multigpu.callbacks.throughput import shown_figures


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

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        return {**super().get_metrics(trainer, pl_module), **shown_figures(trainer)}

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self._enabled:
            print(*args, **kwargs, flush=True)

    def _line(self, trainer: L.Trainer, pl_module: L.LightningModule, prefix: str) -> None:
        elapsed = time.perf_counter() - self._start
        metrics = {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k != "v_num"}
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
        # an iterable dataset without a length has no known total; manual optimization may step several times
        # per batch, which Lightning's estimate does not count
        known = isinstance(total, int) or (isinstance(total, float) and math.isfinite(total))
        position = f"epoch {trainer.current_epoch} step {trainer.global_step}" + (f"/{int(total)}" if known else "")
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        self.print(f"{prefix} {position} [{elapsed:.1f}s] {shown}")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()
        self._every = EveryNSteps(self.every_n_steps, start=trainer.global_step)  # a resumed run: its next multiple

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
    """Lightning's Rich bar, also showing the throughput figures (``SpeedMonitor``)."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float]:
        return {**super().get_metrics(trainer, pl_module), **shown_figures(trainer)}


def progress_bar(mode: str) -> ProgressBar | None:
    """``auto`` (Rich on a terminal, plain otherwise), ``rich``, ``plain``, or ``none``."""
    if mode == "none":
        return None
    if mode == "rich" or (mode == "auto" and sys.stdout.isatty()):
        return TemplateRichProgressBar()
    return PlainProgressBar()
