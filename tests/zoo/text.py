"""A Hugging Face style classifier: batches are dicts, ``forward`` takes keyword arguments and returns a dict;
two validation sets, a test set and ``predict_step``."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Sentences(Dataset):
    """Padded token sequences; the label says whether token 7 occurs in the sentence."""

    def __init__(self, size: int, max_length: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(2, max_length + 1, (size,), generator=g)
        self.tokens = torch.randint(1, vocab, (size, max_length), generator=g)
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        mask = (torch.arange(self.max_length) < self.lengths[index]).long()
        input_ids = self.tokens[index] * mask  # 0 is padding
        return {"input_ids": input_ids, "attention_mask": mask, "labels": (input_ids == 7).any().long()}


class BagOfWordsClassifier(L.LightningModule):
    """Mean of token embeddings under the attention mask, then a linear head."""

    def __init__(self, vocab: int = 16, dim: int = 8, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.head = nn.Linear(dim, 2)

    def forward(self, input_ids, attention_mask, labels=None) -> dict[str, torch.Tensor]:
        mask = attention_mask.unsqueeze(-1).to(self.dtype)
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)
        logits = self.head(pooled)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out

    def training_step(self, batch, batch_idx):
        loss = self(**batch)["loss"]
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        out = self(**batch)
        accuracy = (out["logits"].argmax(-1) == batch["labels"]).to(self.dtype).mean()
        self.log_dict({"val_loss": out["loss"], "val_accuracy": accuracy}, sync_dist=True)

    def test_step(self, batch, batch_idx):
        out = self(**batch)
        self.log("test_accuracy", (out["logits"].argmax(-1) == batch["labels"]).to(self.dtype).mean())

    def predict_step(self, batch, batch_idx):
        return self(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"].softmax(-1)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class SentenceData(L.LightningDataModule):
    """Training, two validation sets (short and long sentences), test and predict sets."""

    def __init__(self, batch_size: int = 32, train_size: int = 32, vocab: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        vocab, size = self.hparams.vocab, self.hparams.train_size
        self.train_set = Sentences(size, 8, vocab, seed=0)
        self.val_sets = [Sentences(7, 4, vocab, seed=1), Sentences(5, 12, vocab, seed=2)]
        self.test_set = Sentences(9, 8, vocab, seed=3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(s, batch_size=4) for s in self.val_sets]

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=4)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=4)
