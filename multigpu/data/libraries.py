"""Loaders of streaming libraries that shard themselves, told by their type; ``StatePerBatch`` (docs/data.md)."""

from __future__ import annotations

import importlib
import sys
from collections import deque
from typing import Any

from torch.utils.data import IterableDataset

# told by type, not by probing: reading a sample of MosaicML's StreamingDataset moves its shared epoch count
SELF_SHARDING = {
    "litdata": ("LitData", ("StreamingDataLoader", "StreamingDataset", "CombinedStreamingDataset",
                            "ParallelStreamingDataset")),
    "streaming": ("MosaicML streaming", ("StreamingDataset",)),
}  # fmt: skip

SELF_SHARDED_MEANING = (
    "per process (the loader shards itself: {library} shares its samples out among the processes, so its order"
    " depends on their number)"
)


def _from_library(value: Any, library: str) -> bool:
    # a library is imported only where a project already uses it
    return library in sys.modules or type(value).__module__.split(".")[0] == library


def shards_itself(loader: Any) -> str | None:
    """The library whose loader (or dataset) shards itself, e.g. ``"LitData"``; None for any other."""
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
    library = shards_itself(loader)
    return SELF_SHARDED_MEANING.format(library=library) if library else None


class StatePerBatch(IterableDataset):
    """``stream`` with its state kept after each batch: Lightning draws a batch ahead from a loader without a length,
    so the stream's own state at a save would be past what was trained."""

    KEPT = 4  # the batch trained and those Lightning drew ahead of it

    def __init__(self, stream: Any, batch_size: int) -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.drawn = 0
        self.states: deque[tuple[int, Any]] = deque(maxlen=self.KEPT)

    def __iter__(self) -> Any:
        drawn, self.drawn = self.drawn, 0
        if not drawn:
            self.states.clear()
        count = 0
        for count, sample in enumerate(self.stream, 1):
            if count % self.batch_size == 0:
                self.states.append((drawn + count // self.batch_size, self.stream.state_dict()))
            yield sample
        if count % self.batch_size:
            self.states.append((drawn + count // self.batch_size + 1, self.stream.state_dict()))

    def state_after(self, batches: int) -> Any:
        return next((state for drawn, state in self.states if drawn == batches), None)

    def restore(self, state: Any, batches: int) -> None:
        if state is not None:
            self.stream.load_state_dict(state)
            self.drawn = batches
            self.states.append((batches, state))

    def set_epoch(self, epoch: int) -> None:
        # Lightning tells a loader's sampler its epoch, not its dataset; Hugging Face's reshuffles by it
        if callable(getattr(self.stream, "set_epoch", None)):
            self.stream.set_epoch(epoch)
