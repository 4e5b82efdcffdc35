"""The project's data: a generated classification set, learnable and the same on every process, with no
download.

Replace it with yours where ``REPLACE`` says. ``GlobalBatchDataModule`` makes ``--data.batch_size`` the global
batch of an optimizer step, orders the data the same way for any number of processes, and resumes exactly in the
middle of an epoch; it builds the loaders from ``self.train_set``, ``self.val_set`` and ``self.test_set``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

from multigpu import ConfigurationError, GlobalBatchDataModule, seeded_generator


class Data(GlobalBatchDataModule):
    """Points labelled by a fixed random linear teacher (REPLACE: your data sets and their options).

    Args:
        features: Size of one input vector.
        classes: Number of classes.
        samples: Training samples (validation and test get a quarter each).
        seed: Seed of the generated sets: every process and every run sees the same data.
        **kwargs: ``GlobalBatchDataModule``'s: ``batch_size`` (samples per optimizer step over all processes,
            128), ``num_workers``, ``pin_memory``.
    """

    def __init__(self, features: int = 20, classes: int = 5, samples: int = 2048, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.features, self.classes, self.samples, self.seed = features, classes, samples, seed

    def prepare_data(self) -> None:
        """Once per machine, on one process: REPLACE with your download or preprocessing (nothing to do here)."""

    def setup(self, stage: str | None = None) -> None:
        """On every process: build the three sets (REPLACE: read your files)."""
        if self.samples < 4:
            raise ConfigurationError(
                f"--data.init_args.samples={self.samples} leaves the validation set empty. Fix: e.g."
                " --data.init_args.samples=2048."
            )
        teacher = torch.randn(self.features, self.classes, generator=seeded_generator(self.seed))
        sets = []
        for split, size in enumerate([self.samples, self.samples // 4, self.samples // 4]):
            inputs = torch.randn(size, self.features, generator=seeded_generator(self.seed + 1 + split))
            sets.append(TensorDataset(inputs, (inputs @ teacher).argmax(dim=1)))
        self.train_set, self.val_set, self.test_set = sets
