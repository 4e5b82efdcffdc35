"""``keep_restored_workers`` on torchdata's ``StatefulDataLoader`` with 2 workers, over a stream that reports its
start until it reads, as Hugging Face's does after ``load_state_dict`` (in the extended suite, for which CI installs
torchdata), and on states without workers."""

from __future__ import annotations

import pytest
import torch

from multigpu.compat.stateful_loader import SNAPSHOT, WORKERS, keep_restored_workers, same
from tests.data.test_hugging_face import Counting


def loader():
    pytest.importorskip("torchdata", reason="needs torchdata: pip install --no-deps torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(Counting(12), batch_size=2, num_workers=2)  # each worker reads all 12


def yielded(state) -> dict[str, int]:
    return {key: entry["dataset_state"]["yielded"] for key, entry in state[SNAPSHOT][WORKERS].items()}


@pytest.mark.extended
def test_a_resumed_workers_restored_state_is_kept_until_it_yields_a_batch():
    straight = [batch.tolist() for batch in loader()]
    first = loader()
    batches = iter(first)
    trained = [next(batches).tolist() for _ in range(3)]  # workers 0, 1, 0
    saved = first.state_dict()
    assert yielded(saved) == {"worker_0": 4, "worker_1": 2}
    del batches

    resumed = loader()
    resumed.load_state_dict(saved)
    batches = iter(resumed)
    started = resumed.state_dict()
    assert yielded(started) == {"worker_0": 0, "worker_1": 0}  # what the workers report before they read
    assert yielded(keep_restored_workers(started, started, saved)) == yielded(saved)
    trained.append(next(batches).tolist())  # worker 1's
    kept = keep_restored_workers(resumed.state_dict(), started, saved)
    assert yielded(kept) == {"worker_0": 4, "worker_1": 4}  # worker 0 restored, worker 1 as it reports
    del batches

    again = loader()
    again.load_state_dict(kept)
    assert trained + [batch.tolist() for batch in again] == straight


def test_a_loader_without_workers_keeps_its_state_as_it_is():
    state = {"_index_sampler_state": None, "_sampler_iter_state": {"samples_yielded": 4}}
    assert keep_restored_workers(state, state, {"_snapshot": {}}) is state


def test_states_are_the_same_by_their_values_tensors_included():
    assert same({"rng": torch.arange(3), "step": [1, (2, "a")]}, {"rng": torch.arange(3), "step": [1, (2, "a")]})
    assert not same({"rng": torch.arange(3)}, {"rng": torch.arange(3.0)})  # another dtype
    assert not same({"rng": torch.arange(3)}, {"rng": torch.arange(1, 4)})
    assert not same([1, 2], (1, 2)) and not same({"a": 1}, {"a": 1, "b": 2})
