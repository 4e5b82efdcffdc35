"""The data-module base class: a global batch size, a world-size-independent order and resumable loaders."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from multigpu.data.sampling import (
    BatchedDataset,
    EvaluationBatches,
    GlobalBatchSampler,
    global_seed,
    per_process_batch_size,
)
from multigpu.data.topology import data_parallel_world


class GlobalBatchDataModule(L.LightningDataModule):
    """Base class for data modules whose ``batch_size`` means one optimizer step over all processes.

    Subclasses build ``self.train_set``, ``self.val_set``, ``self.test_set`` (optionally ``self.predict_set``) in
    ``setup``; this class turns them into loaders whose order does not depend on the strategy or the device count.

    Args:
        batch_size: Global batch size of one optimizer step, across all processes and accumulated micro-batches.
        num_workers: Loader worker processes per training process.
        pin_memory: Pin host memory for faster copies to a GPU (only used when training on a GPU).
    """

    def __init__(self, batch_size: int = 128, num_workers: int = 0, pin_memory: bool = True) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.predict_set: Dataset | None = None

    def _world(self) -> tuple[int, int, int]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0, 1
        data_parallel = data_parallel_world(trainer.strategy)
        size, rank = data_parallel or (trainer.world_size, trainer.global_rank)
        return size, rank, trainer.accumulate_grad_batches

    def _loader_kwargs(self) -> dict[str, Any]:
        trainer = self.trainer
        on_gpu = trainer is not None and trainer.strategy.root_device.type == "cuda"
        return {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory and on_gpu,
            "persistent_workers": self.num_workers > 0,
        }

    def train_dataloader(self) -> DataLoader:
        dataset = self._require(self.train_set, "train_set")
        trainer = self.trainer
        if trainer is not None and trainer.overfit_batches:  # Lightning reads the first batches in order
            world_size, _, accumulate = self._world()
            batch_size = per_process_batch_size(self.batch_size, world_size, accumulate)
            return DataLoader(dataset, batch_size=batch_size, **self._loader_kwargs())
        if trainer is not None and not any(getattr(c, "samples_training_loaders", False) for c in trainer.callbacks):
            return self._sampled_loader(dataset)  # a plain L.Trainer: the engine's loaders callback is not there
        # a generator of its own: the global one stays the training step's
        generator = seeded_generator(global_seed())
        return DataLoader(
            dataset, batch_size=self.batch_size, shuffle=True, generator=generator, **self._loader_kwargs()
        )

    def _sampled_loader(self, dataset: Dataset) -> DataLoader:
        """The global batch shared among the processes by the sampler itself, which Lightning keeps (a
        ``DistributedSampler``): the same math at any device count, without an exact resume mid-epoch."""
        world_size, rank, accumulate = self._world()
        sampler = GlobalBatchSampler(
            dataset, self.batch_size, num_replicas=world_size, rank=rank, accumulate_grad_batches=accumulate
        )
        sampler.set_epoch(self.trainer.current_epoch)  # workers draw before Lightning's set_epoch
        return DataLoader(dataset, batch_size=sampler.micro_batch_size, sampler=sampler, **self._loader_kwargs())

    def _evaluation_loader(self, dataset: Dataset | None, name: str) -> DataLoader:
        dataset = self._require(dataset, name)
        world_size, rank, _ = self._world()
        batch_size = per_process_batch_size(self.batch_size, world_size)
        if self.trainer is not None and self.trainer.overfit_batches:
            # overfit_batches swaps any sampler for a SequentialSampler over the dataset
            return DataLoader(dataset, batch_size=batch_size, **self._loader_kwargs())
        # as many batches on every rank, or per-step collectives in a user's validation_step would hang
        batches = EvaluationBatches(dataset, self.batch_size, num_replicas=world_size, rank=rank)
        generator = torch.Generator().manual_seed(loader_seed(global_seed(), 0, rank))
        return DataLoader(
            BatchedDataset(dataset), batch_size=None, sampler=batches, generator=generator, **self._loader_kwargs()
        )

    def val_dataloader(self) -> DataLoader:
        return self._evaluation_loader(self.val_set, "val_set")

    def test_dataloader(self) -> DataLoader:
        return self._evaluation_loader(self.test_set, "test_set")

    def predict_dataloader(self) -> DataLoader:
        return self._evaluation_loader(self.predict_set if self.predict_set is not None else self.test_set, "test_set")

    def _require(self, dataset: Dataset | None, name: str) -> Dataset:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not build self.{name}.")
        return dataset


def own_training_loader(source: Any) -> bool:
    return type(source).train_dataloader is GlobalBatchDataModule.train_dataloader


def loader_seed(seed: int, epoch: int, rank: int) -> int:
    return ((seed * 1_000_003 + epoch) * 65_537 + rank) & (2**63 - 1)


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator for data that must be the same on every rank and every run."""
    return torch.Generator().manual_seed(seed)
