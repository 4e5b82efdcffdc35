"""Lines every run printed that say nothing about the run, silenced here, each by its exact message.

Each filter matches one message of one library, so every other warning still shows; delete a line below to see
its message again. ``src/cli.py`` calls ``silence_known_noise`` before it builds anything.
"""

from __future__ import annotations

import logging
import os
import warnings

from lightning.fabric.utilities.warnings import PossibleUserWarning

from multigpu.compat import mid_epoch_resume_warning_module, pytree_warning_module

#: Lightning's rank-zero info lines come from one of these loggers, depending on which package was imported last
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropMessage(logging.Filter):
    """A logging filter that drops the records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


#: the advertisement Lightning logs when a Trainer is built without its commercial logger
_LITLOGGER_TIP = _DropMessage("💡 Tip: For seamless cloud logging")


def silence_known_noise() -> None:
    """Install the filters (idempotent: a filter that is already there is not added twice)."""
    # An advertisement for Lightning's cloud logger, at every Trainer; nothing about the run.
    for name in RANK_ZERO_LOGGERS:
        if _LITLOGGER_TIP not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_LITLOGGER_TIP)
    # PyTorch deprecates `LeafSpec` (2.13 warns), which Lightning 2.6's own _pytree helper still uses: once per
    # process, in Lightning's code, nothing a user can change.
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=pytree_warning_module(),
    )
    # Lightning's hint to prefix `srun` fires whenever srun is on PATH (any cluster node), also outside any SLURM
    # job, where there is nothing to launch with srun. Inside a job it stays, and multigpu/checks.py refuses a
    # multi-task job step that srun did not start.
    if "SLURM_JOB_ID" not in os.environ:
        warnings.filterwarnings(
            "ignore",
            message=r"The `srun` command is available on your system but is not used",
            category=PossibleUserWarning,
            module=r"lightning\.fabric\.plugins\.environments\.slurm",
        )
    # The template refuses a fresh fit into a run directory that holds checkpoints (multigpu/checkpoints/resume.py), so
    # Lightning's warning about a non-empty checkpoint folder only appears on a resume, where the folder is meant to
    # hold them.
    warnings.filterwarnings(
        "ignore",
        message=r"Checkpoint directory .* exists and is not empty\.",
        module=r"lightning\.pytorch\.callbacks\.model_checkpoint",
    )
    # DDP (on the CPU, for one): the gradient of a 1x1 convolution comes back with other strides than DDP's bucket
    # only on its two dimensions of size 1, where strides do not change the memory layout, and DDP copies it into
    # the bucket as it does any gradient. Only that case: the warning for any other shape still shows.
    warnings.filterwarnings(
        "ignore",
        message=r"Grad strides do not match bucket view strides(?s:.*)grad\.sizes\(\) = \[\d+, \d+, 1, 1\],",
        category=UserWarning,
        module=r"torch\.autograd\.graph",
    )
    # A resume in the middle of an epoch with a loader Lightning cannot position: the template's own note
    # (multigpu/callbacks/continuation.py) says the same, with the epoch, the batch and the fix.
    warnings.filterwarnings(
        "ignore",
        message=r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not",
        module=mid_epoch_resume_warning_module(),
    )
