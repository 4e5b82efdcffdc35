"""Data written as Lightning's docs, torchvision and streaming libraries show it, none of it the template's: a GAN on
a ``TensorDataset`` with ``DataLoader(shuffle=True)`` and manual optimization; a stream (``IterableDataset``) that does
not shard itself by rank; text classification on dicts with a padding ``collate_fn``, two persistent workers,
``drop_last`` and a random crop drawn in ``__getitem__``. Each model has a ``dropout`` for the resume proof."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from tests.zoo.gan import TinyGAN
from tests.zoo.text import BagOfWordsClassifier

# -- a GAN on a TensorDataset --------------------------------------------------------------------------------


class DropoutGAN(TinyGAN):
    """The GAN of ``gan.py`` with dropout in its discriminator; logs the sum of its losses as ``train_loss`` too."""

    def __init__(self, latent: int = 4, hidden: int = 16, lr: float = 0.01, clip: float = 0.5, dropout: float = 0.0):
        super().__init__(latent, hidden, lr, clip)
        self.discriminator = nn.Sequential(
            nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Dropout(dropout), nn.Linear(hidden, 1)
        )

    def log_dict(self, metrics, *args, **kwargs) -> None:
        if "g_loss" in metrics:
            metrics = {**metrics, "train_loss": metrics["g_loss"] + metrics["d_loss"]}
        super().log_dict(metrics, *args, **kwargs)


class RingTensors(L.LightningDataModule):
    """Points on a ring and their latent vectors as one ``TensorDataset``, shuffled by a plain ``DataLoader``."""

    def __init__(self, size: int = 48, batch_size: int = 8, latent: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        angles = torch.rand(self.hparams.size, generator=g) * 6.2832
        points = torch.stack([angles.cos(), angles.sin()], dim=1)
        self.train_set = TensorDataset(points, torch.randn(self.hparams.size, self.hparams.latent, generator=g))
        self.val_set = TensorDataset(points[:8], torch.randn(8, self.hparams.latent, generator=g))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=4)


# -- a stream that every process reads whole -------------------------------------------------------------------


class NoisyLine(IterableDataset):
    """An endless-looking stream of ``size`` points with noise drawn from torch's global generator as it goes (as a
    stream's augmentation would); it knows nothing of ranks or workers."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        for i in range(self.size):
            x = torch.full((4,), float(i % 17)) / 17
            yield x + 0.05 * torch.randn(4), x.sum(dim=0, keepdim=True).sin()


class StreamRegressor(L.LightningModule):
    """An MLP with dropout on ``(x, y)`` batches."""

    def __init__(self, hidden: int = 16, lr: float = 0.05, dropout: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = (t.to(self.dtype) for t in batch)
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class LineStream(L.LightningDataModule):
    """The stream in a plain ``DataLoader``."""

    def __init__(self, size: int = 48, batch_size: int = 8, num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            NoisyLine(self.hparams.size), batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers
        )


# -- text: dicts, padding, workers, a random crop ------------------------------------------------------------


class CroppedSentences(Dataset):
    """Sentences of varied length; ``__getitem__`` keeps a random window of each (torch's global generator, drawn in
    the loader's workers), as a crop augmentation does. The label: whether token 7 occurs in the window."""

    def __init__(self, size: int, vocab: int, seed: int, window: int = 5) -> None:
        g = torch.Generator().manual_seed(seed)
        self.sentences = [
            torch.randint(1, vocab, (int(n),), generator=g) for n in torch.randint(3, 10, (size,), generator=g)
        ]
        self.window = window

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = self.sentences[index]
        start = int(torch.randint(0, max(1, len(tokens) - self.window + 1), ()))
        crop = tokens[start : start + self.window]
        return {"input_ids": crop, "labels": (crop == 7).any().long()}


def pad(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest sequence, with the attention mask."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = sample["input_ids"]
    return {
        "input_ids": ids,
        "attention_mask": (ids != 0).long(),
        "labels": torch.stack([s["labels"] for s in samples]),
    }


class DropoutClassifier(BagOfWordsClassifier):
    """``text.py``'s classifier with dropout on the pooled embedding."""

    def __init__(self, vocab: int = 16, dim: int = 8, lr: float = 0.1, dropout: float = 0.0) -> None:
        super().__init__(vocab, dim, lr)
        self.drop = nn.Dropout(dropout)

    def forward(self, input_ids, attention_mask, labels=None):
        mask = attention_mask.unsqueeze(-1).to(self.dtype)
        logits = self.head(self.drop((self.embed(input_ids) * mask).sum(1) / mask.sum(1)))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


class CroppedText(L.LightningDataModule):
    """A padding ``collate_fn``, two persistent workers, ``drop_last`` (38 samples: a short last batch)."""

    def __init__(self, batch_size: int = 8, train_size: int = 38, vocab: int = 16, num_workers: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        self.train_set = CroppedSentences(self.hparams.train_size, self.hparams.vocab, seed=0)
        self.val_set = CroppedSentences(6, self.hparams.vocab, seed=1)

    def train_dataloader(self) -> DataLoader:
        workers = self.hparams.num_workers
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True, collate_fn=pad,
                          num_workers=workers, persistent_workers=workers > 0, drop_last=True)  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=3, collate_fn=pad)


class MissingSplit(CroppedText):
    """A data module whose ``train_dataloader`` fails in its own code."""

    def train_dataloader(self) -> DataLoader:
        raise KeyError("no split named 'train'")
