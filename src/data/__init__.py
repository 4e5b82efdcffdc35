"""Data modules. Put yours here: subclass ``GlobalBatchDataModule`` to keep the global batch semantics."""

from src.data.base import GlobalBatchDataModule, ResumableDataLoader
from src.data.images import CIFAR10DataModule
from src.data.sampling import GlobalBatchSampler, ShardSampler, per_process_batch_size
from src.data.text import TextDataModule

__all__ = [
    "CIFAR10DataModule",
    "GlobalBatchDataModule",
    "GlobalBatchSampler",
    "ResumableDataLoader",
    "ShardSampler",
    "TextDataModule",
    "per_process_batch_size",
]
