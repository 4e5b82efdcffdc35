"""The training batches of the loaders the engine keeps: an even end across ranks, states per batch, a resumed
loader's workers given back their restored states until they yield (docs/data.md)."""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import CombinedLoader

from multigpu.compat.stateful_loader import keep_restored_workers
from multigpu.errors import notice


class TrainBatches(CombinedLoader):
    """``CombinedLoader`` whose ranks, given the gloo group ``even_across``, all end the epoch at the first batch one
    of them lacks: a rank ending early would leave the others waiting in their gradient all-reduce. One gloo
    all-reduce per batch."""

    KEPT = 4  # the batch trained and those Lightning drew ahead of it

    def __init__(self, iterables: Any, even_across: Any = None, mode: str = "max_size_cycle") -> None:
        super().__init__(iterables, mode)
        self.even = even_across is not None
        self._group = even_across
        self._batches = 0
        self._start = 0
        self._states: deque[tuple[int, list[Any]]] = deque(maxlen=self.KEPT)
        self._said = False
        self._given: dict[int, Any] = {}  # id(loader): the state a resume gave it, for the epoch it resumes
        self._started: dict[int, tuple[Any, Any]] = {}

    def __iter__(self) -> TrainBatches:
        self._batches, self._start = self._start, 0
        iterator = super().__iter__()  # each loader's iterator made: its workers have reported their states
        given, self._given = self._given, {}
        self._started = {id(x): (x.state_dict(), given[id(x)]) for x in self.positioned() if id(x) in given}
        return iterator

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
        states = [self._state(loader) for loader in self.positioned()]
        if states:
            self._states.append((self._batches, states))
        return out

    def positioned(self) -> list[Any]:
        return [loader for loader in self.flattened if drawn_ahead(loader)]

    def state_after(self, loader: Any, batches: int) -> Any:
        index = next(i for i, positioned in enumerate(self.positioned()) if positioned is loader)
        return next((states[index] for drawn, states in self._states if drawn == batches), self._state(loader))

    def start_at(self, batches: int) -> None:
        self._start = batches

    def give(self, loader: Any, state: Any) -> None:
        """Note the state ``loader`` was given to resume from: until each of its workers yields a batch, that worker's
        part of it is what the loader's state says, not the worker's first report."""
        self._given[id(loader)] = state

    def _state(self, loader: Any) -> Any:
        started = self._started.get(id(loader))
        return loader.state_dict() if started is None else keep_restored_workers(loader.state_dict(), *started)

    def _every_rank_has(self, has: int) -> bool:
        every = torch.tensor([has])
        dist.all_reduce(every, op=dist.ReduceOp.MIN, group=self._group)
        return bool(every.item())

    def _drain(self) -> int:
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
    """Whether ``loader`` has a state of its own and no length: Lightning draws a batch ahead from it."""
    if not (callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))):
        return False
    try:
        len(loader)
    except TypeError:
        return True
    return False


def samples_in(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return next((samples_in(value) for value in values), 1)
