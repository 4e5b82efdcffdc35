"""Data modules. Put yours here: subclass ``GlobalBatchDataModule`` to keep the global batch semantics."""

from src.data.base import GlobalBatchDataModule, ResumableDataLoader
from src.data.images import CIFAR10DataModule
from src.data.sampling import EvaluationBatches, GlobalBatchSampler, per_process_batch_size
from src.data.text import TextDataModule

__all__ = [
    "CIFAR10DataModule",
    "EvaluationBatches",
    "GlobalBatchDataModule",
    "GlobalBatchSampler",
    "ResumableDataLoader",
    "TextDataModule",
    "per_process_batch_size",
]
