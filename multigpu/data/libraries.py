"""Loaders of streaming libraries that shard their samples among processes and workers themselves, told by their
type: the engine keeps them as they are (rebuilding one would break its sharding) and says what their batch means.

A library is imported only where it is already loaded or the loader's class comes from it, so the engine never
imports one a project does not use.
"""

from __future__ import annotations

import sys
from typing import Any

#: LitData's classes that shard themselves by rank and worker (``litdata``), each re-striped by the number of
#: processes, so their order depends on it
LITDATA_CLASSES = ("StreamingDataLoader", "StreamingDataset", "CombinedStreamingDataset", "ParallelStreamingDataset")

#: what the run plan says a self-sharding loader's batch means
SELF_SHARDED_MEANING = (
    "per process (the loader shards itself: {library} stripes its samples among the processes, so its order"
    " depends on their number)"
)


def _from_library(value: Any, library: str) -> bool:
    return library in sys.modules or type(value).__module__.split(".")[0] == library


def shards_itself(loader: Any) -> str | None:
    """The library whose loader (or dataset) shards itself among processes and workers, e.g. ``"LitData"``; None
    for any other."""
    dataset = getattr(loader, "dataset", None)
    if not any(_from_library(value, "litdata") for value in (loader, dataset)):
        return None
    import litdata

    classes = tuple(getattr(litdata, name) for name in LITDATA_CLASSES if hasattr(litdata, name))
    return "LitData" if isinstance(loader, classes) or isinstance(dataset, classes) else None


def self_sharded_meaning(loader: Any) -> str | None:
    """The run plan's ``batch_size_means`` for a loader that shards itself, None for any other."""
    library = shards_itself(loader)
    return SELF_SHARDED_MEANING.format(library=library) if library else None
