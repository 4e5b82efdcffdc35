"""``GlobalBatchDataModule``, the base of a project's data modules, and the samplers behind it."""

from multigpu.data.base import GlobalBatchDataModule, seeded_generator
from multigpu.data.sampling import EvaluationBatches, GlobalBatchSampler, global_seed, per_process_batch_size

__all__ = [
    "EvaluationBatches",
    "GlobalBatchDataModule",
    "GlobalBatchSampler",
    "global_seed",
    "per_process_batch_size",
    "seeded_generator",
]
