"""The engine's sampling of a user's loaders: one global order at any world size, per-sample seeds, a stream's
shares, resumes and one-paragraph errors."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from multigpu.data.loaders import (
    EngineSampler,
    SeededSamples,
    StreamShare,
    TorchRefusal,
    World,
    digest,
    first_sample,
    loader_refusal,
    per_process,
    torch_refusals,
    workers_differ,
)
from multigpu.errors import ConfigurationError
from tests.data.test_hugging_face import Counting


def world(replicas: int = 1, rank: int = 0, accumulate: int = 1, per_process: bool = False) -> World:
    return World(replicas, rank, accumulate, seed=5, per_process=per_process)


def rank_batches(sampler: EngineSampler) -> list[list[int]]:
    indices = [index for index, _ in sampler]
    size = sampler.micro_batch_size
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def global_steps(make, replicas: int, accumulate: int = 1) -> list[list[int]]:
    """Each micro-batch step's samples over all ranks, sorted."""
    per_rank = [rank_batches(make(world(replicas, rank, accumulate))) for rank in range(replicas)]
    return [
        sorted(itertools.chain.from_iterable(per_rank[r][s] for r in range(replicas))) for s in range(len(per_rank[0]))
    ]


class Reversed(Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize("source", [None, Reversed(20)])
def test_the_same_samples_meet_in_every_step_at_any_world_size_and_accumulation(source):
    def make(w):
        return EngineSampler(range(20), 8, w, source=source, shuffle=source is None)

    one = global_steps(make, 1)
    assert len(one) == 2  # 20 samples, global batch 8: the short last batch left out
    for replicas, accumulate in ((2, 1), (4, 1), (2, 2)):
        merged = global_steps(make, replicas, accumulate)
        assert [
            sorted(itertools.chain.from_iterable(merged[i : i + accumulate])) for i in range(0, len(merged), accumulate)
        ] == one
    if source is not None:
        assert one == [sorted(range(12, 20)), sorted(range(4, 12))]  # the user's sampler's order


def test_the_sampler_yields_the_epoch_with_each_index_and_resumes_past_the_trained_batches():
    sampler = EngineSampler(range(16), 4, world())
    sampler.set_epoch(3)
    full = list(sampler)
    assert {epoch for _, epoch in full} == {3}
    sampler.resume_from(3, 2)
    assert list(sampler) == full[8:]


class RandomCrop(Dataset):
    """Draws from torch's generator, and from Python's or numpy's where told."""

    def __init__(self, python: bool = False, numpy: bool = False) -> None:
        self.python, self.numpy = python, numpy

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        value = torch.rand((), dtype=torch.float64) + index
        value += random.random() if self.python else 0.0
        return value + (float(np.random.rand()) if self.numpy else 0.0)


@pytest.mark.parametrize(("python", "numpy"), [(False, False), (True, False), (False, True)])
def test_a_samples_random_draws_depend_on_the_seed_epoch_and_index_only_not_on_the_workers(python, numpy):
    keys = [(index, epoch) for epoch in (0, 1) for index in range(24)]  # past the samples that are probed
    dataset = RandomCrop(python, numpy)
    seeded = SeededSamples(dataset, seed=5)
    torch.manual_seed(0)
    alone = torch.stack([seeded[key] for key in keys])
    assert torch.equal(torch.rand(1), torch.manual_seed(0) and torch.rand(1))  # the training generator untouched
    in_workers = torch.cat(list(DataLoader(SeededSamples(dataset, 5), sampler=keys, batch_size=4, num_workers=2)))
    assert torch.equal(alone, in_workers)
    torch.manual_seed(0)  # every sample at once, as torch's loader asks for a batch (__getitems__), in this process
    at_once = torch.stack(SeededSamples(dataset, 5).__getitems__(keys))
    assert torch.equal(alone, at_once) and torch.equal(torch.rand(1), torch.manual_seed(0) and torch.rand(1))
    assert not torch.equal(alone[:24], alone[24:])  # another epoch draws other crops
    assert (seeded.in_use.python, seeded.in_use.numpy) == (python, numpy)


class Count(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def share_of(replicas: int, rank: int, accumulate: int = 1, workers: int = 0, skip: int = 0) -> list[list[int]]:
    share = StreamShare(Count(22), 8, world(replicas, rank, accumulate))
    share.set_position(0, skip)
    loader = DataLoader(share, batch_size=share.micro, num_workers=workers)
    return [batch.tolist() for batch in loader]


def test_a_stream_is_shared_by_global_batch_among_ranks_and_workers_and_resumes_past_what_was_trained():
    assert share_of(1, 0) == [list(range(8)), list(range(8, 16))]  # the short last global batch is left out
    assert share_of(2, 0) == [[0, 1, 2, 3], [8, 9, 10, 11]] and share_of(2, 1) == [[4, 5, 6, 7], [12, 13, 14, 15]]
    assert share_of(2, 1, accumulate=2) == [[2, 3], [6, 7], [10, 11], [14, 15]]
    assert share_of(2, 1, accumulate=2, workers=2) == share_of(2, 1, accumulate=2)
    assert share_of(2, 1, accumulate=2, workers=2, skip=1) == share_of(2, 1, accumulate=2)[1:]


def test_a_batch_that_does_not_divide_among_the_processes_gets_one_paragraph():
    with pytest.raises(ConfigurationError, match=r"batch_size=6, the global batch .* among 4 process\(es\)") as error:
        per_process(6, world(4), "loader of Data.train_dataloader()")
    assert "for example 4" in str(error.value) and "\n" not in str(error.value)
    assert "--batch_size_per_process=true" in str(error.value)  # Lightning's meaning of batch_size, as the fix
    with pytest.raises(ConfigurationError) as per_process_error:
        per_process(3, world(2, per_process=True), "loader")
    assert "Fix:" in str(per_process_error.value)
    assert "pass --batch_size_per_process" not in str(per_process_error.value)  # already given
    assert per_process(8, world(2, accumulate=2), "loader") == 2


def test_a_samples_fingerprint_is_its_values():
    value = torch.arange(4.0)
    assert digest({"x": value, "y": [1, "a"]}) == digest({"x": value.clone(), "y": [1, "a"]})
    assert digest({"x": value}) != digest({"x": value + 1})
    label = torch.tensor(3)  # 0-dim, 8 bytes: a stream's ``y[i]``
    assert digest((value, label)) == digest((value, torch.tensor(3))) != digest((value, torch.tensor(4)))
    assert digest(torch.tensor(3)) != digest(torch.tensor([3]))  # the shape counts
    assert digest(torch.empty(0, dtype=torch.int64)) != digest(torch.empty(0))


def test_reading_a_streams_first_samples_leaves_the_stream_and_this_processs_generators_as_they_were():
    # the training loader's workers copy the stream as it is after the engine's look: one sample on, a stream that
    # counts its position (Hugging Face's) would tell them it starts one sample in
    stream = Counting(8)
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    generators = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    assert first_sample(stream, seed=5) == digest(0)
    assert not workers_differ(stream, seed=5)  # each worker reads the whole stream
    assert stream.state_dict() == {"yielded": 0}
    assert torch.equal(torch.get_rng_state(), generators[0]) and random.getstate() == generators[1]
    assert np.array_equal(np.random.get_state()[1], generators[2])


class OwnLoader(DataLoader):
    """A user's loader class that checks an argument of its own before torch's."""

    def __init__(self, data: list[int], batch_size: int, limit: int = 10) -> None:
        if len(data) > limit:
            raise ValueError(f"at most {limit} samples, got {len(data)}")
        super().__init__(data, batch_size=batch_size)


def test_an_option_torch_refuses_is_told_apart_from_the_users_own_error_by_its_type():
    with torch_refusals():
        with pytest.raises(TorchRefusal) as refused:
            DataLoader(list(range(4)), batch_size=0)  # torch's BatchSampler refuses it inside DataLoader.__init__
        with pytest.raises(TorchRefusal):
            OwnLoader(list(range(4)), batch_size=-1)  # through a subclass's super().__init__
        with pytest.raises(ValueError) as own:
            OwnLoader(list(range(20)), batch_size=2)
    assert not isinstance(own.value, TorchRefusal)
    paragraph = str(loader_refusal(refused.value, "Data.train_dataloader()"))
    assert paragraph.startswith("Data.train_dataloader() made a loader that torch refused: batch_size should be")
    assert "Fix: change that option (--data.batch_size, or the argument that sets it)" in paragraph
    assert loader_refusal(own.value, "Data.train_dataloader()") is None


def test_torch_refusals_puts_dataloaders_init_back_whatever_happened():
    init = DataLoader.__init__
    with pytest.raises(RuntimeError), torch_refusals():
        assert DataLoader.__init__ is not init
        raise RuntimeError("the data module failed")
    assert DataLoader.__init__ is init
    with pytest.raises(ValueError) as outside:
        DataLoader(list(range(4)), batch_size=0)
    assert not isinstance(outside.value, TorchRefusal)  # outside a data module's hook, torch's own error
