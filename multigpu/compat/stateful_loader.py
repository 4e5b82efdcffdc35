"""torchdata's ``StatefulDataLoader`` state, read where its layout is not documented: each worker's entry."""

from __future__ import annotations

from typing import Any

import torch

#: where a StatefulDataLoader with workers keeps each worker's state (torchdata 0.11,
#: ``_StatefulMultiProcessingDataLoaderIter._SNAPSHOT`` and ``._WORKER_SNAPSHOTS``)
SNAPSHOT, WORKERS = "_snapshot", "_worker_snapshots"


def keep_restored_workers(state: Any, started: Any, restored: Any) -> Any:
    """``state`` with each worker's entry that is still the one it reported when the resumed iterator ``started``
    taken from the ``restored`` state: a worker reports its dataset's ``state_dict()`` before it reads, which a
    Hugging Face stream gives as its start, not as the position it was given, until the worker yields a batch."""
    try:
        now, at_start, given = (entry[SNAPSHOT][WORKERS] for entry in (state, started, restored))
    except (KeyError, TypeError):
        return state  # no workers
    kept = {key: given[key] if key in given and same(value, at_start.get(key)) else value for key, value in now.items()}
    return {**state, SNAPSHOT: {**state[SNAPSHOT], WORKERS: kept}}


def same(a: Any, b: Any) -> bool:
    """Equal states: tensors by their values, anything else as ``==`` says (False where it cannot tell)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        return both and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(map(same, a, b))
    try:
        return bool(a == b)
    except Exception:  # an array's elementwise answer
        return False
