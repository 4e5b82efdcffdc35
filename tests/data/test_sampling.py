"""The data order: the same global batches for any world size and accumulation, resumable mid-epoch."""

import pytest
import torch
from torch.utils.data import TensorDataset

from multigpu.data.sampling import BatchedDataset, GlobalBatchSampler, per_process_batch_size


def steps(dataset_size: int, batch: int, world: int, accumulate: int = 1, epoch: int = 0) -> list[set[int]]:
    """The set of sample indices in each optimizer step, pooled over all ranks and micro-batches."""
    per_rank = []
    for rank in range(world):
        sampler = GlobalBatchSampler(range(dataset_size), batch, world, rank, accumulate, seed=7)
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
    micro = batch // (world * accumulate)
    num_steps = len(per_rank[0]) // (micro * accumulate)
    return [
        {i for order in per_rank for i in order[s * micro * accumulate : (s + 1) * micro * accumulate]}
        for s in range(num_steps)
    ]


@pytest.mark.parametrize(("world", "accumulate"), [(2, 1), (4, 1), (1, 4), (2, 2), (8, 2)])
def test_every_optimizer_step_sees_the_same_samples_for_any_world_size(world, accumulate):
    reference = steps(1000, 64, world=1)
    assert len(reference) == 1000 // 64
    assert steps(1000, 64, world, accumulate) == reference


def test_micro_batches_keep_the_single_process_order_within_a_step():
    single = list(GlobalBatchSampler(range(100), 8, 1, 0, seed=1))
    ranks = [list(GlobalBatchSampler(range(100), 8, 2, r, seed=1)) for r in range(2)]
    assert single[:8] == ranks[0][:4] + ranks[1][:4]


def test_each_epoch_is_a_new_permutation_and_reproducible():
    sampler = GlobalBatchSampler(range(256), 32, seed=3)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(first) == sorted(second) == list(range(256))
    assert first != second
    again = GlobalBatchSampler(range(256), 32, seed=3)
    assert list(again) == first


def test_incomplete_last_global_batch_is_dropped():
    sampler = GlobalBatchSampler(range(100), 32)
    assert len(sampler) == len(list(sampler)) == 96
    assert sampler.batches_per_epoch == 3


def test_resume_skips_the_batches_already_trained_on_that_epoch_only():
    full = GlobalBatchSampler(range(128), 16, num_replicas=2, rank=1, seed=5)
    full.set_epoch(2)
    order = list(full)
    resumed = GlobalBatchSampler(range(128), 16, num_replicas=2, rank=1, seed=5)
    resumed.resume_from(epoch=2, batches_done=3)
    assert list(resumed) == order[3 * 8 :]
    assert len(resumed) == len(order)  # Lightning counts the skipped batches as done
    resumed.set_epoch(3)
    assert len(list(resumed)) == len(order)  # the skip applies once


def test_resume_after_a_complete_epoch_starts_the_next_one():
    sampler = GlobalBatchSampler(range(64), 16, seed=0)
    sampler.resume_from(epoch=0, batches_done=4)
    expected = GlobalBatchSampler(range(64), 16, seed=0)
    expected.set_epoch(1)
    assert sampler.epoch == 1
    assert list(sampler) == list(expected)


@pytest.mark.parametrize(("batch", "world", "accumulate"), [(30, 4, 1), (32, 2, 3), (5, 8, 1)])
def test_batch_that_does_not_divide_names_the_option_and_a_fix(batch, world, accumulate):
    with pytest.raises(ValueError, match=r"--data.batch_size=\d+ .*Fix: set --data.batch_size to a multiple of"):
        per_process_batch_size(batch, world, accumulate)


def test_batch_larger_than_the_dataset_is_refused():
    with pytest.raises(ValueError, match="larger than the training set"):
        GlobalBatchSampler(range(10), 16)


def test_batched_dataset_reads_a_batch_per_index_list():
    data = BatchedDataset(TensorDataset(torch.arange(10.0)))
    (values,) = data[[2, 5, 7]]
    assert values.tolist() == [2.0, 5.0, 7.0]
