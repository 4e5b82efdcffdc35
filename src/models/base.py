"""The LightningModule base class: optimizer and LR scheduler chosen on the command line."""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torchmetrics import Metric

from src.compat import attached_trainer, batch_progress


def at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """Upcast fp16/bf16 logits before a softmax or loss; leave fp32 and fp64 alone."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


class WeightedMean(Metric):
    """A sample-weighted mean (or several, updated together) that never waits for the device.

    ``MeanMetric``'s arithmetic without its update's NaN check (a host-device sync every step; see
    ``docs/benchmarks.md``); a NaN loss shows as a NaN mean. ``shape=(k,)`` keeps ``k`` means updated by one call.
    """

    full_state_update = False

    def __init__(self, shape: tuple[int, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("mean_value", torch.zeros(shape), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros(()), dist_reduce_fx="sum")

    def update(self, value: torch.Tensor, weight: float | torch.Tensor) -> None:
        """Add ``value`` (of the metric's shape) with ``weight``, the number of samples it stands for."""
        self.mean_value += value * weight
        self.weight += weight

    def compute(self) -> torch.Tensor:
        return self.mean_value / self.weight


class TemplateModule(L.LightningModule):
    """Base class for this template's models: injects the optimizer and LR scheduler.

    Both are callables LightningCLI builds from ``--model.init_args.optimizer`` and ``--model.init_args.lr_scheduler``
    (any class from ``torch.optim`` or your own). A missing ``lr_scheduler_monitor`` skips a step with a warning.

    Args:
        optimizer: Builds the optimizer from the parameters, e.g. ``torch.optim.AdamW`` with its options.
        lr_scheduler: Builds a scheduler from the optimizer; ``None`` keeps the learning rate constant.
        lr_scheduler_interval: Step the scheduler every optimizer ``step`` or every ``epoch``; by default every
            ``epoch`` for ``ReduceLROnPlateau`` (it watches a validation metric) and every ``step`` otherwise.
        lr_scheduler_monitor: Metric a ``ReduceLROnPlateau`` scheduler watches.
    """

    def __init__(
        self,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: Literal["step", "epoch"] | None = None,
        lr_scheduler_monitor: str = "val/loss",
    ) -> None:
        super().__init__()
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.lr_scheduler_interval = lr_scheduler_interval
        self.lr_scheduler_monitor = lr_scheduler_monitor

    def configure_optimizers(self) -> Any:
        """Build the optimizer (and scheduler) from the injected factories."""
        optimizer = self.optimizer_factory(self.parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": scheduler,
                "interval": self.lr_scheduler_interval or ("epoch" if plateau else "step"),
                "monitor": self.lr_scheduler_monitor,
                # a metric that is not logged (yet, or at all) skips the step with Lightning's warning naming it
                "strict": False,
            },
        }

    def should_log_step(self) -> bool:
        """True on the optimizer steps whose per-step metrics the logger will write: ``self.log`` costs about
        0.25 ms per value even when nothing is written (``docs/benchmarks.md``)."""
        trainer = attached_trainer(self)
        if trainer is None:
            return False
        logged = (self.global_step + 1) % max(1, trainer.log_every_n_steps) == 0
        return logged and batch_progress(trainer).current.ready % trainer.accumulate_grad_batches == 0
