"""Base of a project's data modules: ``GlobalBatchDataModule`` (global batch size, an order that does not depend on
the number of processes, a resumable loader) and the samplers behind it."""

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
