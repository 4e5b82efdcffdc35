"""The LightningModule base classes: optimizer and LR scheduler chosen on the command line, and a classifier."""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MaxMetric, Metric
from torchmetrics.classification import MulticlassAccuracy

from multigpu.compat import attached_trainer, batch_progress


def at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """Upcast fp16/bf16 logits before a softmax or loss; leave fp32 and fp64 alone."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


class WeightedMean(Metric):
    """A sample-weighted mean (``shape=(k,)``: k of them) without ``MeanMetric``'s NaN check, a sync every step."""

    full_state_update = False

    def __init__(self, shape: tuple[int, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("mean_value", torch.zeros(shape), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros(()), dist_reduce_fx="sum")

    def update(self, value: torch.Tensor, weight: float | torch.Tensor) -> None:
        self.mean_value += value * weight
        self.weight += weight

    def compute(self) -> torch.Tensor:
        return self.mean_value / self.weight


class TemplateModule(L.LightningModule):
    """Base class for this template's models: the optimizer and LR scheduler come from the command line.

    Args:
        optimizer: Optimizer class and options, e.g. ``--model.optimizer=SGD --model.optimizer.lr=0.1``.
        lr_scheduler: Scheduler class and options (``torch.optim.lr_scheduler``), or none for a constant rate.
        lr_scheduler_interval: Step the scheduler every ``step`` or ``epoch`` (default: ``epoch`` for a plateau).
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
                "strict": False,  # a metric not logged (yet) skips the step with Lightning's warning
            },
        }

    def log_computed(self, metrics: dict[str, Tensor], **kwargs: Any) -> None:
        """Log values every rank holds alike (a ``compute()``'s) with ``sync_dist``, which Lightning asks for."""
        self.log_dict(metrics, sync_dist=True, **kwargs)

    def should_log_step(self) -> bool:
        """True on the optimizer steps whose metrics the logger writes: ``self.log`` costs ~0.25 ms a value anyway."""
        trainer = attached_trainer(self)
        if trainer is None:
            return False
        logged = (self.global_step + 1) % max(1, trainer.log_every_n_steps) == 0
        return logged and batch_progress(trainer).current.ready % trainer.accumulate_grad_batches == 0


class Classifier(TemplateModule):
    """Base class for a classifier: a subclass sets ``self.net``, a network from inputs to class logits.

    Args:
        num_classes: Number of classes.
        lr_scheduler_monitor: Metric a ``ReduceLROnPlateau`` scheduler watches.
        **kwargs: The optimizer and LR scheduler options of ``TemplateModule``.
    """

    net: nn.Module

    def __init__(self, num_classes: int, lr_scheduler_monitor: str = "val/acc", **kwargs: Any) -> None:
        super().__init__(lr_scheduler_monitor=lr_scheduler_monitor, **kwargs)
        # one metric per stage, so epoch reductions never mix; validate_args=False: no host-device syncs
        self.train_means = WeightedMean(shape=(2,))  # loss, accuracy: the weighted mean is micro accuracy exactly
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.test_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_loss, self.test_loss = WeightedMean(), WeightedMean()
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # a resumed run continues its best so far

    def forward(self, inputs: Tensor) -> Tensor:
        """Inputs ``(N, ...)`` -> class logits ``(N, num_classes)``."""
        return self.net(inputs.to(self.dtype))  # follows --trainer.precision=64-true / bf16-true

    def model_step(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Return (mean loss, predicted classes, labels) for a batch ``(inputs, labels)``."""
        inputs, labels = batch
        logits = self(inputs)
        return F.cross_entropy(at_least_fp32(logits), labels), logits.argmax(dim=1), labels

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """One micro-batch of training; returns the loss Lightning backpropagates."""
        loss, preds, labels = self.model_step(batch)
        accuracy = (preds == labels).to(loss.dtype).mean()
        self.train_means.update(torch.stack([loss.detach(), accuracy]), weight=len(labels))
        if self.should_log_step():
            self.log("train/loss", loss.detach(), sync_dist=True)
        return loss

    def on_train_epoch_end(self) -> None:
        loss, accuracy = self.train_means.compute()
        self.log_computed({"train/loss_epoch": loss, "train/acc": accuracy})
        self.train_means.reset()

    def _accumulate(self, batch: tuple[Tensor, Tensor], loss_mean: WeightedMean, accuracy: Metric) -> None:
        loss, preds, labels = self.model_step(batch)
        loss_mean.update(loss, weight=len(labels))
        accuracy.update(preds, labels)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._accumulate(batch, self.val_loss, self.val_acc)

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()
        metrics = {"val/loss": self.val_loss.compute(), "val/acc": acc}
        if not self.trainer.sanity_checking:  # a few batches only: keep them out of the best so far
            self.val_acc_best.update(acc)
            metrics["val/acc_best"] = self.val_acc_best.compute()
        self.log_computed(metrics, prog_bar=True)
        self.val_loss.reset()
        self.val_acc.reset()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._accumulate(batch, self.test_loss, self.test_acc)

    def on_test_epoch_end(self) -> None:
        self.log_computed({"test/loss": self.test_loss.compute(), "test/acc": self.test_acc.compute()})
        self.test_loss.reset()
        self.test_acc.reset()

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Class probabilities ``(N, num_classes)``."""
        inputs, _ = batch
        return at_least_fp32(self(inputs)).softmax(dim=1)
