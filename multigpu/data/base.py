"""The data-module base class: a global batch size, a world-size-independent order and resumable loaders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from multigpu.compat import batch_progress
from multigpu.data.sampling import (
    BatchedDataset,
    EvaluationBatches,
    GlobalBatchSampler,
    global_seed,
    per_process_batch_size,
)
from multigpu.topology import data_parallel_world


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` whose position in the epoch Lightning saves in checkpoints: taken from the training loop
    (``position()``), as prefetching and workers read ahead of what has been trained on.

    Starting an epoch draws the workers' base seed from the loader's own generator, seeded from the run's seed, the
    epoch and the rank, not from torch's global one: the model's random draws (dropout) then do not depend on where
    a run was resumed, and the workers get the same seeds in a resumed epoch as in an uninterrupted one.
    """

    def __init__(self, *args: Any, position: Callable[[], dict[str, int]] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("generator", torch.Generator())
        super().__init__(*args, **kwargs)
        self.position = position

    def __iter__(self) -> Any:
        sampler = self.sampler
        if isinstance(sampler, GlobalBatchSampler) and self.generator is not None:
            self.generator.manual_seed(loader_seed(sampler.seed, sampler.epoch, sampler.rank))
        return super().__iter__()

    def state_dict(self) -> dict[str, int]:
        return self.position() if self.position is not None else {}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        if state_dict and isinstance(self.sampler, GlobalBatchSampler):
            self.sampler.resume_from(state_dict["epoch"], state_dict["batches_done"], state_dict.get("epoch_length"))


class GlobalBatchDataModule(L.LightningDataModule):
    """Base class for data modules whose ``batch_size`` means one optimizer step over all processes.

    Subclasses build ``self.train_set``, ``self.val_set``, ``self.test_set`` (and optionally ``self.predict_set``)
    in ``setup``; this class turns them into loaders whose order does not depend on the strategy, the device count
    or the accumulation (``multigpu/data/sampling.py``).

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

    # -- how this process fits into the run --------------------------------------------------------------------

    def _world(self) -> tuple[int, int, int]:
        """(data-parallel size, data-parallel rank, accumulated micro-batches per step); (1, 0, 1) outside a Trainer.
        The ranks of one tensor-parallel group load the same samples."""
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

    def _training_position(self) -> dict[str, int]:
        trainer = self.trainer
        assert trainer is not None
        return {
            "epoch": trainer.current_epoch,
            # `processed` counts the batch whose step just finished, which `completed` does not yet count while
            # `on_train_batch_end` callbacks (ModelCheckpoint, preemption) are saving.
            "batches_done": batch_progress(trainer).current.processed,
            "epoch_length": int(min(trainer.num_training_batches, 2**62)),
        }

    # -- loaders -------------------------------------------------------------------------------------------------

    def train_dataloader(self) -> DataLoader:
        dataset = self._require(self.train_set, "train_set")
        world_size, rank, accumulate = self._world()
        sampler = GlobalBatchSampler(
            dataset, self.batch_size, num_replicas=world_size, rank=rank, accumulate_grad_batches=accumulate
        )
        if self.trainer is not None:
            # workers draw from the sampler as soon as the loader is iterated, before Lightning's `set_epoch`
            sampler.set_epoch(self.trainer.current_epoch)
        return ResumableDataLoader(
            dataset,
            batch_size=sampler.micro_batch_size,
            sampler=sampler,
            position=self._training_position if self.trainer is not None else None,
            **self._loader_kwargs(),
        )

    def _evaluation_loader(self, dataset: Dataset | None, name: str) -> DataLoader:
        dataset = self._require(dataset, name)
        world_size, rank, _ = self._world()
        batch_size = per_process_batch_size(self.batch_size, world_size)
        if self.trainer is not None and self.trainer.overfit_batches:
            # overfit_batches swaps any sampler for a SequentialSampler over the dataset: give it a plain loader
            return DataLoader(dataset, batch_size=batch_size, **self._loader_kwargs())
        # the same global batches at every world size, as many on every rank (per-step collectives in a user's
        # validation_step would otherwise hang), every sample once; see EvaluationBatches
        batches = EvaluationBatches(dataset, self.batch_size, num_replicas=world_size, rank=rank)
        # a generator of its own: a validation draws nothing from the global one the training step draws from
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


def loader_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of a loader's own generator for ``epoch`` on ``rank`` (distinct for every pair), within the 63 bits
    ``torch.Generator.manual_seed`` takes: a drawn seed (``seed_everything: true``) has 32."""
    return ((seed * 1_000_003 + epoch) * 65_537 + rank) & (2**63 - 1)


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator for data that must be the same on every rank and every run."""
    return torch.Generator().manual_seed(seed)
