"""A dataset's random draws while it loads a sample, made a function of the run's seed, the epoch and the sample; in
the training process, kept apart from the training step's draws."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import get_worker_info

try:
    import numpy as np
except ImportError:  # numpy is optional for torch
    np = None  # type: ignore[assignment]


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return ((seed * 1_000_003 + epoch) * 2_654_435_761 + index) & (2**63 - 1)


def seed_generators(seed: int, python: bool = True, numpy: bool = True) -> None:
    torch.default_generator.manual_seed(seed)  # the CPU generator alone: no CUDA state is touched
    if python:
        random.seed(seed)
    if numpy and np is not None:
        np.random.seed(seed % 2**32)


def capture(python: bool = True, numpy: bool = True) -> tuple[Any, ...]:
    return (
        torch.get_rng_state(),
        random.getstate() if python else None,
        np.random.get_state() if numpy and np is not None else None,
    )


def put_back(states: tuple[Any, ...]) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        random.setstate(states[1])
    if states[2] is not None:
        np.random.set_state(states[2])


class GeneratorsInUse:
    """Which of Python's and numpy's generators a dataset draws from: seeding both costs more than a small sample."""

    PROBED = 16

    def __init__(self) -> None:
        self.python = self.numpy = False
        self.probed = 0

    def probing(self) -> bool:
        return self.probed < self.PROBED

    def load(self, seed: int, read: Any) -> Any:
        if not self.probing():
            seed_generators(seed, self.python, self.numpy)
            return read()
        seed_generators(seed)
        seeded = random.getstate(), np.random.get_state()[1:] if np is not None else None
        sample = read()
        self.probed += 1
        self.python |= random.getstate() != seeded[0]
        if np is not None:
            after = np.random.get_state()[1:]
            self.numpy |= after[1:] != seeded[1][1:] or not (after[0] == seeded[1][0]).all()
        return sample


def in_worker() -> bool:
    return get_worker_info() is not None


@contextmanager
def isolated(python: bool = True, numpy: bool = True) -> Iterator[None]:
    if in_worker():
        yield
        return
    saved = capture(python, numpy)
    try:
        yield
    finally:
        put_back(saved)


def seeded_stream(stream: Any, seed: int) -> Iterator[Any]:
    """Iterate ``stream`` with its generators seeded from ``seed``, kept apart from the training step's."""
    if in_worker():
        seed_generators(seed)
        yield from stream
        return
    with isolated():
        seed_generators(seed)
        iterator = iter(stream)
        own = capture()
    while True:
        with isolated():
            put_back(own)
            try:
                sample = next(iterator)
            except StopIteration:
                return
            own = capture()
        yield sample
