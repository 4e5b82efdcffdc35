"""Data read through streaming libraries' own loaders, as their docs show it: LitData's ``StreamingDataset`` in a
``StreamingDataLoader`` (chunks written by ``litdata.optimize``) and torchdata's ``StatefulDataLoader`` with workers.
Every sample carries its integer ``id``, so a test can count which samples an epoch trained; the model logs them."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

#: the float features of each sample
FEATURES = 4


def sample(index: int) -> dict[str, torch.Tensor | int]:
    """Sample ``index``: its id and features drawn from a generator seeded by it."""
    x = torch.randn(FEATURES, generator=torch.Generator().manual_seed(index))
    return {"id": index, "x": x}


class Samples(Dataset):
    """``size`` samples in memory (map-style)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | int]:
        return sample(index)


class IdRegressor(L.LightningModule):
    """An MLP with dropout regressing the sum of the features; with ``ids_file``, each rank appends the ids of every
    batch it trains to ``<ids_file>.<rank>``, one line per batch, and of every batch it validates to
    ``<ids_file>-val.<rank>`` (not in Lightning's sanity check). With ``decay``, its learning rate falls linearly
    over ``trainer.estimated_stepping_batches``, read in ``configure_optimizers`` as schedules do: before the
    checkpoint's loops are restored, which makes Lightning set up the training data early."""

    def __init__(
        self, hidden: int = 16, lr: float = 0.05, dropout: float = 0.1, ids_file: str = "", decay: bool = False
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        loss = self.model_step(batch, "")
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.model_step(batch, "-val"), sync_dist=True)

    def model_step(self, batch, ids_suffix: str) -> torch.Tensor:
        """The batch's loss; its ids appended to the ids file of the stage (``ids_suffix``)."""
        if self.hparams.ids_file and not self.trainer.sanity_checking:
            with open(f"{self.hparams.ids_file}{ids_suffix}.{self.global_rank}", "a") as file:
                file.write(" ".join(str(int(i)) for i in batch["id"]) + "\n")
        x = batch["x"].to(self.dtype)
        return F.mse_loss(self.net(x), x.sum(dim=1, keepdim=True).sin())

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        if not self.hparams.decay:
            return optimizer
        steps = int(self.trainer.estimated_stepping_batches)
        schedule = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class LitStreamData(L.LightningDataModule):
    """Chunks in ``input_dir`` (written by ``litdata.optimize``) read by LitData's own loader, shuffled."""

    def __init__(self, input_dir: str, batch_size: int = 4, num_workers: int = 1) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(self.hparams.input_dir, shuffle=True, drop_last=True)
        return StreamingDataLoader(dataset, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)

    def val_dataloader(self):
        from litdata import StreamingDataLoader, StreamingDataset

        # drop_last=False: LitData's default under several processes drops samples to even out the ranks
        dataset = StreamingDataset(self.hparams.input_dir, drop_last=False)
        return StreamingDataLoader(dataset, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)


class StatefulData(L.LightningDataModule):
    """``size`` in-memory samples in torchdata's ``StatefulDataLoader``, shuffled, with workers."""

    def __init__(self, size: int = 64, batch_size: int = 4, num_workers: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(
            Samples(self.hparams.size),
            batch_size=self.hparams.batch_size,
            shuffle=True,
            num_workers=self.hparams.num_workers,
        )


def write_chunks(output_dir: str, size: int = 64) -> None:
    """``size`` samples written into LitData chunks in ``output_dir`` (one writer process)."""
    from litdata import optimize

    optimize(fn=sample, inputs=list(range(size)), output_dir=output_dir, chunk_bytes="2KB", num_workers=1)


def columns(size: int) -> dict[str, list]:
    """``size`` samples as columns (``id``, ``x``), as Hugging Face's ``Dataset.from_dict`` takes them."""
    rows = [sample(index) for index in range(size)]
    return {"id": [row["id"] for row in rows], "x": [row["x"].tolist() for row in rows]}


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes, read from ``torch.distributed`` as a data module does."""
    import torch.distributed as dist

    initialized = dist.is_available() and dist.is_initialized()
    return (dist.get_rank(), dist.get_world_size()) if initialized else (0, 1)


class HFMapData(L.LightningDataModule):
    """``size`` samples in a Hugging Face ``Dataset`` (``from_dict``, torch format) in a plain shuffled
    ``DataLoader``."""

    def __init__(self, size: int = 64, batch_size: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.dataset(), batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.dataset(), batch_size=self.hparams.batch_size)

    def dataset(self):
        from datasets import Dataset

        return Dataset.from_dict(columns(self.hparams.size)).with_format("torch")


class HFStreamData(L.LightningDataModule):
    """``size`` samples in a Hugging Face ``IterableDataset`` of ``num_shards`` shards, split by rank with
    ``datasets.distributed.split_dataset_by_node``, in a plain ``DataLoader`` (with ``stateful``: torchdata's
    ``StatefulDataLoader``, which keeps its workers' positions)."""

    def __init__(
        self, size: int = 64, batch_size: int = 4, num_shards: int = 4, num_workers: int = 0, stateful: bool = False
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        return self.loader()

    def val_dataloader(self):
        return self.loader()

    def loader(self):
        from datasets import Dataset
        from datasets.distributed import split_dataset_by_node

        stream = Dataset.from_dict(columns(self.hparams.size)).to_iterable_dataset(num_shards=self.hparams.num_shards)
        rank, world = rank_and_world()
        split = split_dataset_by_node(stream.with_format("torch"), rank=rank, world_size=world)
        options = {"batch_size": self.hparams.batch_size, "num_workers": self.hparams.num_workers}
        if not self.hparams.stateful:
            return torch.utils.data.DataLoader(split, **options)
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(split, **options)


def write_shards(folder: str, size: int = 64, shards: int = 4) -> None:
    """``size`` samples written into ``shards`` WebDataset tar files in ``folder`` (``webdataset.TarWriter``)."""
    import webdataset as wds

    per_shard = size // shards
    for shard in range(shards):
        with wds.TarWriter(f"{folder}/shard-{shard:02d}.tar") as writer:
            for index in range(shard * per_shard, (shard + 1) * per_shard):
                record = {"id": index, "x": sample(index)["x"].tolist()}
                writer.write({"__key__": f"{index:06d}", "json": record})


def from_record(record: dict) -> dict[str, torch.Tensor | int]:
    """A decoded WebDataset record as a sample (a function of the module: loader workers unpickle it)."""
    return {"id": record["json"]["id"], "x": torch.tensor(record["json"]["x"])}


class WebDatasetData(L.LightningDataModule):
    """The tar files in ``shards`` read by ``webdataset.WebDataset``, split by node and by worker, in a plain
    ``DataLoader`` with workers."""

    def __init__(self, shards: str, batch_size: int = 4, num_workers: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        return self.loader()

    def val_dataloader(self):
        return self.loader()

    def loader(self):
        import webdataset as wds

        urls = sorted(str(path) for path in Path(self.hparams.shards).glob("*.tar"))
        stream = wds.WebDataset(
            urls, nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker, shardshuffle=False
        )
        return torch.utils.data.DataLoader(
            stream.decode().map(from_record), batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers
        )
