"""Data read through MosaicML's streaming library (``mosaicml-streaming``), as its README shows it: samples written
by its ``MDSWriter`` into shards, read by its ``StreamingDataset`` (which shards itself among processes by the
``RANK``/``WORLD_SIZE`` variables of the launch) in its ``StreamingDataLoader``. Every sample carries its ``id``,
as in ``tests/zoo/streaming.py``, whose model (``IdRegressor``) logs the ids each rank trained."""

from __future__ import annotations

import sys
import types
from typing import Any

import lightning as L
import numpy as np

from tests.zoo.streaming import sample

#: each sample's columns, as MDSWriter takes them
COLUMNS = {"id": "int", "x": "ndarray:float32"}


def import_streaming() -> Any:
    """``streaming``, MosaicML's package. It imports its vision examples at its own import, which need a torchvision
    built for the installed torch; where none imports (a CPU-only torch, whose torchvision only PyTorch's own index
    serves), those examples are left out: the writer, dataset and loader read here use none of it."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def write_mds(output_dir: str, size: int = 64, shard_bytes: int = 1 << 10) -> None:
    """``size`` samples written by ``MDSWriter`` into shards of about ``shard_bytes`` in ``output_dir``."""
    streaming = import_streaming()
    with streaming.MDSWriter(out=output_dir, columns=COLUMNS, size_limit=shard_bytes) as writer:
        for index in range(size):
            row = sample(index)
            writer.write({"id": index, "x": row["x"].numpy().astype(np.float32)})


class MosaicData(L.LightningDataModule):
    """The shards in ``local`` read by ``streaming.StreamingDataset`` (shuffled) in its ``StreamingDataLoader``, or
    in a plain ``DataLoader`` with ``plain_loader``."""

    def __init__(self, local: str, batch_size: int = 4, num_workers: int = 0, plain_loader: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        streaming = import_streaming()
        import torch

        dataset = streaming.StreamingDataset(local=self.hparams.local, shuffle=True, batch_size=self.hparams.batch_size)
        loader = torch.utils.data.DataLoader if self.hparams.plain_loader else streaming.StreamingDataLoader
        return loader(dataset, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)

    def val_dataloader(self):
        streaming = import_streaming()

        dataset = streaming.StreamingDataset(local=self.hparams.local, batch_size=self.hparams.batch_size)
        return streaming.StreamingDataLoader(dataset, batch_size=self.hparams.batch_size)
