"""Batch size and learning rate found from the command line: the ``tune`` subcommand."""

from multigpu.tuning.scaling import global_batch_size, scaled_lr
from multigpu.tuning.trainer import Trainer, TuneResult

__all__ = ["Trainer", "TuneResult", "global_batch_size", "scaled_lr"]
