"""Loaders of streaming libraries that shard their samples among processes and workers themselves, told by their
type: the engine keeps them as they are (rebuilding one would break its sharding) and says what their batch means.

A library is imported only where it is already loaded or the loader's class comes from it, so the engine never
imports one a project does not use.

A stream that shards itself by rank and has a position of its own (``state_dict``/``load_state_dict``: Hugging Face's
``IterableDataset`` split with ``datasets.distributed.split_dataset_by_node``) is read through ``StatePerBatch``,
which keeps its state after each batch, so that a checkpoint saves the state after the batches trained.
"""

from __future__ import annotations

import importlib
import sys
from collections import deque
from typing import Any

from torch.utils.data import IterableDataset

#: by the top-level package of each library whose loaders shard themselves among processes and workers: its name and
#: the classes of its own that do (a loader or its dataset). LitData's re-stripe by the number of processes;
#: MosaicML's ``StreamingDataset`` reads that number from torchrun's variables and counts its epochs in shared
#: memory, so a probe that reads a sample would move it to its next epoch: only its type tells
SELF_SHARDING = {
    "litdata": ("LitData", ("StreamingDataLoader", "StreamingDataset", "CombinedStreamingDataset",
                            "ParallelStreamingDataset")),
    "streaming": ("MosaicML streaming", ("StreamingDataset",)),
}  # fmt: skip

#: what the run plan says a self-sharding loader's batch means
SELF_SHARDED_MEANING = (
    "per process (the loader shards itself: {library} shares its samples out among the processes, so its order"
    " depends on their number)"
)


def _from_library(value: Any, library: str) -> bool:
    return library in sys.modules or type(value).__module__.split(".")[0] == library


def shards_itself(loader: Any) -> str | None:
    """The library whose loader (or dataset) shards itself among processes and workers, e.g. ``"LitData"``; None
    for any other."""
    dataset = getattr(loader, "dataset", None)
    for package, (library, names) in SELF_SHARDING.items():
        if not any(_from_library(value, package) for value in (loader, dataset)):
            continue
        module = importlib.import_module(package)
        classes = tuple(getattr(module, name) for name in names if isinstance(getattr(module, name, None), type))
        if isinstance(loader, classes) or isinstance(dataset, classes):
            return library
    return None


def self_sharded_meaning(loader: Any) -> str | None:
    """The run plan's ``batch_size_means`` for a loader that shards itself, None for any other."""
    library = shards_itself(loader)
    return SELF_SHARDED_MEANING.format(library=library) if library else None


class StatePerBatch(IterableDataset):
    """``stream`` (its own position in ``state_dict``) read in the loader's process, with its state after each batch
    of ``batch_size`` samples the loader draws: Lightning draws a batch ahead of the one it trains from a loader
    without a length, so the stream's own state at a checkpoint would be one batch past what was trained."""

    #: the latest states kept: the batch trained and those Lightning drew ahead of it
    KEPT = 4

    def __init__(self, stream: Any, batch_size: int) -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.drawn = 0  # batches of the epoch drawn before the next iteration starts (a resume's)
        self.states: deque[tuple[int, Any]] = deque(maxlen=self.KEPT)

    def __iter__(self) -> Any:
        drawn, self.drawn = self.drawn, 0
        if not drawn:
            self.states.clear()  # another epoch's
        count = 0
        for count, sample in enumerate(self.stream, 1):
            if count % self.batch_size == 0:
                self.states.append((drawn + count // self.batch_size, self.stream.state_dict()))
            yield sample
        if count % self.batch_size:  # the last, shorter batch
            self.states.append((drawn + count // self.batch_size + 1, self.stream.state_dict()))

    def state_after(self, batches: int) -> Any:
        """The stream's state after ``batches`` batches of the epoch; None before the first of this run."""
        return next((state for drawn, state in self.states if drawn == batches), None)

    def restore(self, state: Any, batches: int) -> None:
        """Start the next iteration where ``state`` stands, ``batches`` batches into the epoch."""
        if state is not None:
            self.stream.load_state_dict(state)
            self.drawn = batches
            self.states.append((batches, state))

    def set_epoch(self, epoch: int) -> None:
        """Tell the stream its epoch (Hugging Face's restores a saved state in the saved epoch only, and reshuffles
        by it); Lightning tells a loader's sampler, not its dataset."""
        if callable(getattr(self.stream, "set_epoch", None)):
            self.stream.set_epoch(epoch)
