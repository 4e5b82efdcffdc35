"""Image classification: a compact ResNet for 32x32 images, trained with cross-entropy."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from lightning.fabric.utilities import measure_flops
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MaxMetric
from torchmetrics.classification import MulticlassAccuracy

from src.models.base import TemplateModule, WeightedMean, at_least_fp32


def _norm(channels: int) -> nn.GroupNorm:
    # GroupNorm, not BatchNorm: its output does not depend on how the global batch is split between devices,
    # so single device, dp and ddp compute the same function (BatchNorm would need SyncBatchNorm under ddp
    # and still differs under dp, where only replica 0 updates the running statistics).
    return nn.GroupNorm(num_groups=min(8, channels), num_channels=channels)


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions with a skip connection; ``stride=2`` halves the resolution."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.norm2 = _norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), _norm(out_channels)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class CompactResNet(nn.Module):
    """A ResNet for small images: a 3x3 stem, one stage per width (each after the first halves the resolution)."""

    def __init__(
        self,
        num_classes: int = 10,
        widths: tuple[int, ...] = (32, 64, 128),
        blocks_per_stage: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), _norm(widths[0]), nn.ReLU())
        stages, in_channels = [], widths[0]
        for stage, width in enumerate(widths):
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                stages.append(ResidualBlock(in_channels, width, stride))
                in_channels = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(in_channels, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.stages(self.stem(x)))


class ImageClassifier(TemplateModule):
    """Classifies images with ``CompactResNet``; logs ``{train,val,test}/{loss,acc}`` and ``val/acc_best``.

    Args:
        num_classes: Number of classes.
        widths: Channels of each stage; each stage after the first halves the resolution.
        blocks_per_stage: Residual blocks per stage.
        dropout: Dropout before the classifier (0 keeps training identical across strategies).
        optimizer: Optimizer class and options, e.g. ``--model.optimizer=SGD --model.optimizer.lr=0.1``.
        lr_scheduler: Scheduler class and options (``torch.optim.lr_scheduler``), or none for a constant rate.
        lr_scheduler_interval: Step the scheduler every optimizer ``step`` or every ``epoch`` (default: per
            ``epoch`` for ``ReduceLROnPlateau``, per ``step`` otherwise).
        lr_scheduler_monitor: Metric a ``ReduceLROnPlateau`` scheduler watches.
    """

    def __init__(
        self,
        num_classes: int = 10,
        widths: tuple[int, ...] = (32, 64, 128),
        blocks_per_stage: int = 1,
        dropout: float = 0.0,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: Literal["step", "epoch"] | None = None,
        lr_scheduler_monitor: str = "val/acc",
    ) -> None:
        super().__init__(optimizer, lr_scheduler, lr_scheduler_interval, lr_scheduler_monitor)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.net = CompactResNet(num_classes, tuple(widths), blocks_per_stage, dropout)
        # one metric object per stage, so epoch reductions never mix; validate_args=False and WeightedMean keep
        # the updates free of host-device syncs. Training runs one update per step for its loss and accuracy
        # means (the sample-weighted mean of each batch's accuracy is micro accuracy exactly)
        self.train_means = WeightedMean(shape=(2,))  # loss, accuracy
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.test_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_loss, self.test_loss = WeightedMean(), WeightedMean()
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # saved in checkpoints: a resumed run continues its best so far

    def flops_per_sample(self, image_size: int = 32) -> int:
        """Training FLOPs (forward + backward) of one image, counted on the meta device, for the throughput MFU."""
        hp = self.hparams
        with torch.device("meta"):
            net = CompactResNet(hp.num_classes, tuple(hp.widths), hp.blocks_per_stage, hp.dropout)
            images = torch.empty(1, 3, image_size, image_size)
        return measure_flops(net, lambda: net(images), lambda logits: logits.sum())

    def forward(self, images: Tensor) -> Tensor:
        """Images ``(N, 3, H, W)`` -> class logits ``(N, num_classes)``."""
        return self.net(images.to(self.dtype))  # follows --trainer.precision=64-true / bf16-true

    def model_step(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Return (mean loss, predicted classes, labels) for a batch ``(images, labels)``."""
        images, labels = batch
        logits = self(images)
        return F.cross_entropy(at_least_fp32(logits), labels), logits.argmax(dim=1), labels

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """One micro-batch of training; returns the loss Lightning backpropagates."""
        loss, preds, labels = self.model_step(batch)
        accuracy = (preds == labels).to(loss.dtype).mean()
        self.train_means.update(torch.stack([loss.detach(), accuracy]), weight=len(labels))
        if self.should_log_step():
            self.log("train/loss", loss.detach(), prog_bar=True, sync_dist=True)
        return loss

    def on_train_epoch_end(self) -> None:
        # compute() reduces the metric states of all processes
        loss, accuracy = self.train_means.compute()
        self.log_dict({"train/loss_epoch": loss, "train/acc": accuracy})
        self.train_means.reset()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Accumulate validation loss (weighted by batch size) and accuracy."""
        loss, preds, labels = self.model_step(batch)
        self.val_loss.update(loss, weight=len(labels))
        self.val_acc.update(preds, labels)

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()
        metrics = {"val/loss": self.val_loss.compute(), "val/acc": acc}
        if not self.trainer.sanity_checking:  # a few batches only: keep them out of the best so far
            self.val_acc_best.update(acc)
            metrics["val/acc_best"] = self.val_acc_best.compute()
        self.log_dict(metrics, prog_bar=True)
        self.val_loss.reset()
        self.val_acc.reset()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Accumulate test loss and accuracy."""
        loss, preds, labels = self.model_step(batch)
        self.test_loss.update(loss, weight=len(labels))
        self.test_acc.update(preds, labels)

    def on_test_epoch_end(self) -> None:
        self.log_dict({"test/loss": self.test_loss.compute(), "test/acc": self.test_acc.compute()})
        self.test_loss.reset()
        self.test_acc.reset()

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Class probabilities ``(N, num_classes)``."""
        images, _ = batch
        return at_least_fp32(self(images)).softmax(dim=1)
