"""Lines every run printed that say nothing about the run, each silenced by its exact message, so every other
warning still shows."""

from __future__ import annotations

import logging
import os
import warnings

from lightning.fabric.utilities.warnings import PossibleUserWarning

from multigpu.compat import mid_epoch_resume_warning_module, pytree_warning_module

#: Lightning's rank-zero info lines come from one of these loggers, depending on which package was imported last
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


_LITLOGGER_TIP = _DropMessage("💡 Tip: For seamless cloud logging")


def silence_known_noise() -> None:
    """Install the filters (idempotent)."""
    # an advertisement for Lightning's cloud logger
    for name in RANK_ZERO_LOGGERS:
        if _LITLOGGER_TIP not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_LITLOGGER_TIP)
    # torch 2.13 deprecates `LeafSpec`, which Lightning 2.6's own _pytree helper still uses
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=pytree_warning_module(),
    )
    # Lightning's hint to prefix `srun` fires whenever srun is on PATH, also outside a SLURM job
    if "SLURM_JOB_ID" not in os.environ:
        warnings.filterwarnings(
            "ignore",
            message=r"The `srun` command is available on your system but is not used",
            category=PossibleUserWarning,
            module=r"lightning\.fabric\.plugins\.environments\.slurm",
        )
    # a fresh fit into a folder of checkpoints is refused, so this shows only on a resume, where it is meant to
    warnings.filterwarnings(
        "ignore",
        message=r"Checkpoint directory .* exists and is not empty\.",
        module=r"lightning\.pytorch\.callbacks\.model_checkpoint",
    )
    # a 1x1 convolution's strides differ from DDP's bucket only on dimensions of size 1, with the same memory layout
    warnings.filterwarnings(
        "ignore",
        message=r"Grad strides do not match bucket view strides(?s:.*)grad\.sizes\(\) = \[\d+, \d+, 1, 1\],",
        category=UserWarning,
        module=r"torch\.autograd\.graph",
    )
    # a mid-epoch resume: multigpu/checkpoints/continuation.py's own note says it with the epoch, the batch and the fix
    warnings.filterwarnings(
        "ignore",
        message=r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not",
        module=mid_epoch_resume_warning_module(),
    )
