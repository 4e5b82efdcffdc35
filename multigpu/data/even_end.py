"""The training loaders of a fit where a rank may run out of batches before the others (a stream that shards itself
among the processes: shards, or samples, that do not divide evenly among them). Under ddp a rank that ends its epoch
early leaves the others waiting in their gradient all-reduce until the collective times out. ``EvenEnd`` makes the
ranks agree, batch by batch, whether every one of them has a batch, and ends the epoch on every rank at the first
batch one of them lacks, as ``torch.distributed.algorithms.Join`` has ranks agree on uneven inputs; the batches the
others had left are not trained this epoch, and one line says how many samples that leaves out.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import CombinedLoader

from multigpu.errors import notice


class EvenEnd(CombinedLoader):
    """``CombinedLoader`` whose every rank ends the epoch at the first batch one of them lacks (the module
    docstring). The agreement is one small all-reduce per batch on a gloo group of its own: no host-device sync."""

    def __init__(self, iterables: Any, mode: str = "max_size_cycle") -> None:
        super().__init__(iterables, mode)
        self._group: Any = None
        self._batches = 0
        self._said = False

    def __iter__(self) -> EvenEnd:
        if self._group is None:  # every rank starts the epoch's iterator at the same point
            self._group = dist.new_group(backend="gloo")
        self._batches = 0
        return super().__iter__()

    def __next__(self) -> Any:
        try:
            out, has = super().__next__(), 1
        except StopIteration:
            out, has = None, 0
        every = torch.tensor([has])
        dist.all_reduce(every, op=dist.ReduceOp.MIN, group=self._group)
        if every.item():
            self._batches += 1
            return out
        left = samples_in(out[0]) + self._drain() if has else 0
        self._tell(has, left)
        raise StopIteration

    def _drain(self) -> int:
        """The samples of the batches this rank has left in its epoch, read to be counted."""
        left = 0
        for out in iter(super().__next__, None):
            left += samples_in(out[0])
        return left

    def _tell(self, has: int, left: int) -> None:
        ends: list[Any] = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(ends, (has, left), group=self._group)
        untrained = sum(count for _, count in ends)
        if untrained and not self._said and dist.get_rank() == 0:
            self._said = True
            short = ", ".join(str(rank) for rank, (had, _) in enumerate(ends) if not had)
            notice(
                f"the training loader's shards are uneven among the processes: rank(s) {short} ran out after"
                f" {self._batches} batches of the epoch, so every rank ends its epoch there (the others' batches left,"
                f" {untrained} samples, are not trained this epoch; said once per run)."
            )


def samples_in(batch: Any) -> int:
    """The number of samples in a collated ``batch``: the first dimension of its first tensor (1 without one)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return next((samples_in(value) for value in values), 1)
