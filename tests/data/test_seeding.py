"""Random draws of the data path seeded per sample, without touching the training step's generators."""

from __future__ import annotations

import random

import torch

from multigpu.data.seeding import isolated, sample_seed, seed_generators, seeded_stream


def test_sample_seeds_differ_for_every_epoch_and_index():
    seeds = {sample_seed(42, epoch, index) for epoch in range(3) for index in range(-1, 100)}
    assert len(seeds) == 3 * 101 and all(0 <= seed < 2**63 for seed in seeds)


def test_draws_inside_isolated_leave_the_training_generators_as_they_were():
    torch.manual_seed(0)
    random.seed(0)
    expected = torch.rand(3), random.random()
    torch.manual_seed(0)
    random.seed(0)
    with isolated():
        seed_generators(7)
        torch.rand(5), random.random()
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def noisy(count: int):
    for _ in range(count):
        yield torch.rand(()).item()


def test_a_seeded_stream_draws_from_its_seed_whatever_the_training_step_draws_between_samples():
    alone = list(seeded_stream(noisy(4), seed=3))
    torch.manual_seed(0)
    interleaved = []
    for value in seeded_stream(noisy(4), seed=3):
        interleaved.append(value)
        torch.rand(10)  # the training step's dropout
    assert interleaved == alone
    torch.manual_seed(0)
    after = torch.rand(1)
    torch.manual_seed(0)
    list(seeded_stream(noisy(4), seed=3))
    assert torch.equal(torch.rand(1), after)  # the stream left the training generator where it was
