"""Data order that does not depend on the number of processes: each takes a fixed slice of every global batch. The
samplers subclass ``DistributedSampler`` because Lightning leaves one it finds alone and replaces any other."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler, default_collate


def per_process_batch_size(global_batch_size: int, world_size: int, accumulate_grad_batches: int = 1) -> int:
    """The micro-batch one process loads so that all processes together step on ``global_batch_size``."""
    shards = world_size * accumulate_grad_batches
    if global_batch_size < 1 or global_batch_size % shards:
        example = shards * max(1, global_batch_size // shards)
        raise ValueError(
            f"--data.batch_size={global_batch_size} is the global batch of one optimizer step and must divide evenly"
            f" among {world_size} process(es) x {accumulate_grad_batches} accumulated micro-batch(es) = {shards}."
            f" Fix: set --data.batch_size to a multiple of {shards} (for example {example}),"
            " or change --trainer.devices / --trainer.num_nodes / --trainer.accumulate_grad_batches."
        )
    return global_batch_size // shards


def global_seed() -> int:
    """The seed ``seed_everything`` set for this run, as Lightning's own samplers read it."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class GlobalBatchSampler(DistributedSampler):
    """This process's slice of every micro-batch of every global batch; a short last global batch is dropped."""

    meaning = "global batch of one optimizer step (--data.batch_size)"

    def __init__(
        self,
        dataset: Sized,
        global_batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        accumulate_grad_batches: int = 1,
        shuffle: bool = True,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            dataset,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=global_seed() if seed is None else seed,
            drop_last=True,
        )
        self.global_batch_size = global_batch_size
        self.accumulate_grad_batches = accumulate_grad_batches
        self.micro_batch_size = per_process_batch_size(global_batch_size, num_replicas, accumulate_grad_batches)
        self.num_global_batches = len(dataset) // global_batch_size
        if self.num_global_batches == 0:
            raise ValueError(
                f"--data.batch_size={global_batch_size} is larger than the training set ({len(dataset)} samples),"
                " so not one full optimizer step fits in an epoch. Fix: lower --data.batch_size."
            )
        self.num_samples = self.num_global_batches * accumulate_grad_batches * self.micro_batch_size
        self._resume: tuple[int, int] | None = None

    @property
    def batches_per_epoch(self) -> int:
        return self.num_global_batches * self.accumulate_grad_batches

    def resume_from(self, epoch: int, batches_done: int, epoch_length: int | None = None) -> None:
        """Start the next pass at micro-batch ``batches_done`` of ``epoch``, or at the next epoch if it was done."""
        if batches_done >= (epoch_length or self.batches_per_epoch):
            epoch, batches_done = epoch + 1, 0
        self.set_epoch(epoch)
        self._resume = (epoch, batches_done)

    def epoch_order(self) -> torch.Tensor:
        n = self.num_global_batches * self.global_batch_size
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            return torch.randperm(len(self.dataset), generator=generator)[:n]
        return torch.arange(n)

    def __iter__(self) -> Iterator[int]:
        # [global batch, micro-batch, rank, sample] -> this rank's slices, in step order
        order = self.epoch_order().view(
            self.num_global_batches, self.accumulate_grad_batches, self.num_replicas, self.micro_batch_size
        )
        mine = order[:, :, self.rank].reshape(-1)
        skip = 0
        if self._resume is not None:
            resume_epoch, batches_done = self._resume
            self._resume = None
            if resume_epoch == self.epoch:
                skip = batches_done * self.micro_batch_size
        return iter(mine[skip:].tolist())

    def __len__(self) -> int:
        # the full epoch even after a resume: Lightning counts the skipped batches as done
        return self.num_samples


def global_evaluation_batches(total: int, global_batch_size: int, world_size: int = 1) -> list[range]:
    # a last batch with fewer samples than processes joins the one before: no process gets an empty batch
    starts = list(range(0, total, global_batch_size))
    if len(starts) > 1 and total - starts[-1] < world_size:
        starts.pop()
    return [range(start, end) for start, end in itertools.pairwise([*starts, total])]


def rank_share(batch: range, world_size: int, rank: int, total: int) -> list[int]:
    # a set smaller than the world repeats a sample rather than leave a rank without one
    base, extra = divmod(len(batch), world_size)
    start = batch.start + rank * base + min(rank, extra)
    share = list(range(start, start + base + (1 if rank < extra else 0)))
    return share or [rank % total]


class EvaluationBatches(DistributedSampler):
    """This rank's slice of each global evaluation batch, as index lists: every sample once, as many batches a rank."""

    def __init__(self, dataset: Sized, global_batch_size: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        if global_batch_size < num_replicas:
            raise ValueError(
                f"--data.batch_size={global_batch_size} is smaller than the {num_replicas} processes that share each"
                f" evaluation batch. Fix: set --data.batch_size to at least {num_replicas}."
            )
        total = len(dataset)
        self.global_batch_size = global_batch_size
        self.batches = [
            rank_share(batch, num_replicas, rank, total)
            for batch in global_evaluation_batches(total, global_batch_size, num_replicas)
        ]

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class BatchedDataset(Dataset):
    """Reads a whole batch per index list, so a sampler can choose each batch's size (see ``EvaluationBatches``)."""

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list[Any]], Any] = default_collate) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn

    def __getitem__(self, indices: list[int]) -> Any:
        return self.collate_fn([self.dataset[i] for i in indices])

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]
