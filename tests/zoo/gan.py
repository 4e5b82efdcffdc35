"""A GAN in miniature (BigGAN's training step, two networks of a few units): manual optimization, two
optimizers, ``toggle_optimizer``, ``manual_backward`` and ``clip_gradients``; the data is an ``IterableDataset``."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class RingPoints(IterableDataset):
    """Points on a noisy ring with the latent vector each one is paired with; each process reads its own share.

    An ``IterableDataset`` is not split by Lightning, so it splits itself by rank (and loader worker), as the
    PyTorch documentation shows.
    """

    def __init__(self, size: int, latent: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.size, self.latent, self.seed, self.rank, self.world_size = size, latent, seed, rank, world_size

    def __iter__(self):
        worker = get_worker_info()
        shards = self.world_size * (worker.num_workers if worker else 1)
        shard = self.rank * (worker.num_workers if worker else 1) + (worker.id if worker else 0)
        g = torch.Generator().manual_seed(self.seed)
        angles = torch.rand(self.size, generator=g) * 6.2832
        points = torch.stack([angles.cos(), angles.sin()], dim=1) + 0.05 * torch.randn(self.size, 2, generator=g)
        latents = torch.randn(self.size, self.latent, generator=g)
        for i in range(shard, self.size, shards):
            yield points[i], latents[i]


class TinyGAN(L.LightningModule):
    """Generator and discriminator, one manual step each per batch (discriminator first)."""

    def __init__(self, latent: int = 4, hidden: int = 16, lr: float = 0.01, clip: float = 0.5) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        real, z = (t.to(self.dtype) for t in batch)
        opt_g, opt_d = self.optimizers()
        fake = self(z)

        self.toggle_optimizer(opt_d)
        real_logits, fake_logits = self.discriminator(real), self.discriminator(fake.detach())
        d_loss = F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
        d_loss = d_loss + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        self.clip_gradients(opt_d, gradient_clip_val=self.hparams.clip, gradient_clip_algorithm="norm")
        opt_d.step()
        self.untoggle_optimizer(opt_d)

        self.toggle_optimizer(opt_g)
        logits = self.discriminator(fake)
        g_loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        self.clip_gradients(opt_g, gradient_clip_val=self.hparams.clip, gradient_clip_algorithm="norm")
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

    def validation_step(self, batch, batch_idx):
        _, z = batch
        z = z.to(self.dtype)
        # how far generated points are from the ring of radius 1
        self.log("ring_error", (self(z).norm(dim=1) - 1).abs().mean(), sync_dist=True)

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr, betas=(0.5, 0.999))
        return opt_g, opt_d


class RingData(L.LightningDataModule):
    """``batch_size`` per process; the stream is split by rank inside the dataset."""

    def __init__(self, size: int = 64, batch_size: int = 64, latent: int = 4, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def _loader(self, seed: int) -> DataLoader:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        dataset = RingPoints(self.hparams.size, self.hparams.latent, seed, rank, world)
        return DataLoader(dataset, batch_size=self.hparams.batch_size)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.hparams.seed)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.hparams.seed + 1)
