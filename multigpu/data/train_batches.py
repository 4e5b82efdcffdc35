"""The training batches Lightning draws from the loaders the engine keeps as they are, where two things need the
batch as it is drawn:

- **An even end.** A stream that shards itself among the processes may give one rank fewer batches than another
  (shards, or samples, that do not divide evenly among them); under ddp the rank that ends its epoch early leaves
  the others waiting in their gradient all-reduce until the collective times out. With ``even``, the ranks agree,
  batch by batch, whether every one of them has a batch, and every rank ends the epoch at the first batch one of
  them lacks, as ``torch.distributed.algorithms.Join`` has ranks agree on uneven inputs; the batches the others had
  left are not trained this epoch, and one line says how many samples that leaves out.
- **A state after the batches trained.** Lightning draws a batch ahead from a loader without a length, so a loader's
  own state (torchdata's ``StatefulDataLoader`` over a stream) at a save is one batch past those trained: the state
  of each such loader is kept after each batch it yields.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import CombinedLoader

from multigpu.errors import notice


class TrainBatches(CombinedLoader):
    """``CombinedLoader`` with an even end across the ranks (``even``) and the states of its loaders that have one
    and no length kept per batch (the module docstring). The agreement is one small all-reduce per batch on a gloo
    group of its own: no host-device sync."""

    #: the latest states kept: the batch trained and those Lightning drew ahead of it
    KEPT = 4

    def __init__(self, iterables: Any, even: bool, mode: str = "max_size_cycle") -> None:
        super().__init__(iterables, mode)
        self.even = even
        self._group: Any = None
        self._batches = 0  # of the epoch, drawn
        self._start = 0  # batches of the epoch trained before a resume's first iteration
        self._states: deque[tuple[int, list[Any]]] = deque(maxlen=self.KEPT)
        self._said = False

    def __iter__(self) -> TrainBatches:
        if self.even and self._group is None:  # every rank starts the epoch's iterator at the same point
            self._group = dist.new_group(backend="gloo")
        self._batches, self._start = self._start, 0
        return super().__iter__()

    def __next__(self) -> Any:
        try:
            out, has = super().__next__(), 1
        except StopIteration:
            if not self.even:
                raise
            out, has = None, 0
        if self.even and not self._every_rank_has(has):
            self._tell(has, samples_in(out[0]) + self._drain() if has else 0)
            raise StopIteration
        self._batches += 1
        states = [loader.state_dict() for loader in self.positioned()]
        if states:
            self._states.append((self._batches, states))
        return out

    def positioned(self) -> list[Any]:
        """The loaders whose state is kept per batch: a state of their own, no length."""
        return [loader for loader in self.flattened if drawn_ahead(loader)]

    def state_after(self, loader: Any, batches: int) -> Any:
        """``loader``'s state after ``batches`` batches of the epoch; its state now if none was kept for them."""
        index = next(i for i, positioned in enumerate(self.positioned()) if positioned is loader)
        return next((states[index] for drawn, states in self._states if drawn == batches), loader.state_dict())

    def start_at(self, batches: int) -> None:
        """The next iteration starts ``batches`` batches into the epoch (a resume's, its loaders' states restored)."""
        self._start = batches

    def _every_rank_has(self, has: int) -> bool:
        every = torch.tensor([has])
        dist.all_reduce(every, op=dist.ReduceOp.MIN, group=self._group)
        return bool(every.item())

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


def drawn_ahead(loader: Any) -> bool:
    """Whether ``loader`` has a state of its own and no length, so that Lightning draws a batch ahead from it."""
    if not (callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))):
        return False
    try:
        len(loader)
    except TypeError:
        return True
    return False


def samples_in(batch: Any) -> int:
    """The number of samples in a collated ``batch``: the first dimension of its first tensor (1 without one)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return next((samples_in(value) for value in values), 1)
