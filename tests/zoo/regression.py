"""A small regression model and its data, as a user would write them: plain Lightning, ``train/mse``, ``val/mse``."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from multigpu import GlobalBatchDataModule


def line_points(n: int, seed: int) -> TensorDataset:
    """Inputs on a 0..255 scale (like pixels) and a noisy nonlinear target."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 4, generator=g) * 255
    y = (x / 255).sin().sum(dim=1, keepdim=True) + 0.01 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


class Regressor(L.LightningModule):
    """An MLP that rescales its inputs in place and uses an in-place activation."""

    def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        x /= 255  # in place, on the loader's batch
        loss = F.mse_loss(self(x.to(self.dtype)), y.to(self.dtype))
        self.log("train/mse", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        x /= 255
        error = F.mse_loss(self(x.to(self.dtype)), y.to(self.dtype))
        # per-step collectives: every rank must run the same number of validation steps
        self.log("val/mse", error, on_step=True, on_epoch=True, sync_dist=True, prog_bar=True)
        gathered = self.all_gather(error.detach())
        self.log("val/mse_worst_rank", gathered.max(), on_epoch=True, rank_zero_only=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class RegressionData(L.LightningDataModule):
    """Plain ``DataLoader``s: shuffled training (Lightning brings its own sampler under ddp)."""

    def __init__(
        self, train_size: int = 64, val_size: int = 13, batch_size: int = 64, num_workers: int = 0, seed: int = 0
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    def setup(self, stage: str) -> None:
        self.train_set = line_points(self.hparams.train_size, self.hparams.seed)
        self.val_set = line_points(self.hparams.val_size, self.hparams.seed + 1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.hparams.batch_size,
            shuffle=True,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=4, num_workers=self.hparams.num_workers)


class GlobalRegressionData(GlobalBatchDataModule):
    """The same data through the template's ``GlobalBatchDataModule`` (global batch, resumable mid-epoch)."""

    def __init__(self, train_size: int = 64, val_size: int = 5, batch_size: int = 4, seed: int = 0) -> None:
        super().__init__(batch_size=batch_size, pin_memory=False)
        self.sizes, self.seed = (train_size, val_size), seed

    def setup(self, stage: str) -> None:
        self.train_set = line_points(self.sizes[0], self.seed)
        self.val_set = line_points(self.sizes[1], self.seed + 1)
