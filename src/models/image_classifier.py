"""Image classification: a compact ResNet for 32x32 images, trained with cross-entropy."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lightning.fabric.utilities import measure_flops
from torch import Tensor, nn

from multigpu import Classifier


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


class ImageClassifier(Classifier):
    """Classifies images ``(N, 3, H, W)`` with ``CompactResNet``; trains and logs as ``Classifier`` does.

    Args:
        num_classes: Number of classes.
        widths: Channels of each stage; each stage after the first halves the resolution.
        blocks_per_stage: Residual blocks per stage.
        dropout: Dropout before the classifier (0 keeps training identical across strategies).
        **kwargs: The optimizer and LR scheduler options (``TemplateModule``, ``Classifier``).
    """

    def __init__(
        self,
        num_classes: int = 10,
        widths: tuple[int, ...] = (32, 64, 128),
        blocks_per_stage: int = 1,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes, **kwargs)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.net = CompactResNet(num_classes, tuple(widths), blocks_per_stage, dropout)

    def flops_per_sample(self, image_size: int = 32) -> int:
        """Training FLOPs (forward + backward) of one image, counted on the meta device, for the throughput MFU."""
        hp = self.hparams
        with torch.device("meta"):
            net = CompactResNet(hp.num_classes, tuple(hp.widths), hp.blocks_per_stage, hp.dropout)
            images = torch.empty(1, 3, image_size, image_size)
        return measure_flops(net, lambda: net(images), lambda logits: logits.sum())
