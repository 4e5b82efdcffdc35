"""Data order that does not depend on the strategy or the number of processes.

``--data.batch_size`` is the *global* batch of one optimizer step. Every process takes a fixed slice of each
global batch, so one process sees, step for step, what N processes see together, and the averaged gradient
is the same. Lightning's own ``DistributedSampler`` would instead shuffle each rank's share separately, so
changing ``--trainer.devices`` would silently change which samples meet in a step.

The samplers subclass ``DistributedSampler`` on purpose: Lightning leaves a ``DistributedSampler`` it finds in
a dataloader alone, while it replaces any other sampler with its own under DDP.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler, default_collate


def per_process_batch_size(global_batch_size: int, world_size: int, accumulate_grad_batches: int = 1) -> int:
    """Return the micro-batch one process loads so that all processes together step on ``global_batch_size``.

    >>> per_process_batch_size(128, world_size=4, accumulate_grad_batches=2)
    16
    """
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
    """Yields this process's share of every global batch, in an order shared by all world sizes.

    Epoch ``e`` draws one permutation from ``seed + e`` (the same on every rank), cuts it into global batches of
    ``global_batch_size`` (an incomplete last one is dropped so that every step averages the same number of
    samples), each global batch into ``accumulate_grad_batches`` micro-batches and each micro-batch into
    ``num_replicas`` equal slices. Rank ``r`` yields slice ``r`` of every micro-batch in turn; a ``DataLoader``
    with ``batch_size=per_process_batch_size(...)`` then cuts exactly those slices.

    ``resume_from(epoch, batches_done)`` makes the next pass over ``epoch`` skip the micro-batches a checkpoint
    had already trained on, which is what makes a mid-epoch resume bit-for-bit the same run.
    """

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
        """Micro-batches this process loads per epoch (the same on every rank)."""
        return self.num_global_batches * self.accumulate_grad_batches

    def resume_from(self, epoch: int, batches_done: int, epoch_length: int | None = None) -> None:
        """Start the next pass at micro-batch ``batches_done`` of ``epoch``, or at the next epoch if that one was
        complete (``epoch_length``: the batches the trainer runs per epoch, fewer with ``limit_train_batches``)."""
        if batches_done >= (epoch_length or self.batches_per_epoch):
            epoch, batches_done = epoch + 1, 0
        self.set_epoch(epoch)
        self._resume = (epoch, batches_done)

    def _epoch_order(self) -> torch.Tensor:
        n = self.num_global_batches * self.global_batch_size
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            return torch.randperm(len(self.dataset), generator=generator)[:n]
        return torch.arange(n)

    def __iter__(self) -> Iterator[int]:
        # [global batch, micro-batch, rank, sample] -> this rank's slices, in step order
        order = self._epoch_order().view(
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
        # The full epoch even after a resume: Lightning counts the skipped batches as already done.
        return self.num_samples


class ShardSampler(DistributedSampler):
    """Splits an evaluation set into contiguous, non-overlapping shards, one per rank, without padding.

    Lightning's ``DistributedSampler`` pads the last shard with repeated samples, which counts them twice in
    validation metrics. Here shard sizes differ by at most one sample, so every sample is counted once and the
    metrics that torchmetrics reduces across ranks are exact.
    """

    def __init__(self, dataset: Sized, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        total = len(dataset)
        base, extra = divmod(total, num_replicas)
        self.start = rank * base + min(rank, extra)
        self.num_samples = base + (1 if rank < extra else 0)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.start + self.num_samples))

    def __len__(self) -> int:
        return self.num_samples


class EvenShardBatches(DistributedSampler):
    """This rank's ``ShardSampler`` shard cut into batches, with the same number of batches on every rank.

    Under ``ddp`` every rank must run the same number of evaluation steps: a ``validation_step`` that logs with
    ``sync_dist=True`` on each step, or calls ``self.all_gather``, starts a collective per step, and a rank with
    one batch more would wait for the others forever. Unequal shards (a set that does not divide by the number
    of processes) would give unequal batch counts, so the batch count is fixed by the smallest shard and the
    larger shards put their extra sample into one of their batches: batch sizes may differ by one sample
    between ranks, but every sample is still counted exactly once and torchmetrics reductions stay exact.
    Only a set smaller than the number of processes is padded (each empty rank evaluates one repeated sample,
    counted twice), because a batch cannot be empty.

    It yields lists of indices; use it with ``BatchedDataset`` and ``DataLoader(batch_size=None)``.
    """

    def __init__(self, dataset: Sized, batch_size: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        total = len(dataset)
        shard = torch.tensor(list(ShardSampler(dataset, num_replicas, rank)), dtype=torch.long)
        if total and len(shard) == 0:
            shard = torch.tensor([rank % total])  # a set smaller than the world: pad rather than starve a rank
        num_batches = -(-max(total // num_replicas, 1) // batch_size) if total else 0
        self.batches = [chunk.tolist() for chunk in torch.tensor_split(shard, num_batches)] if num_batches else []

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class BatchedDataset(Dataset):
    """Reads a whole batch per index list, so a sampler can choose each batch's size (see ``EvenShardBatches``)."""

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list[Any]], Any] = default_collate) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn

    def __getitem__(self, indices: list[int]) -> Any:
        return self.collate_fn([self.dataset[i] for i in indices])

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]
