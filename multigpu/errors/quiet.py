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
    for message, category, module in _known_warnings():
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def _known_warnings() -> list[tuple[str, type[Warning], str]]:
    """The (message, category, module) patterns of the warnings that say nothing about the run."""
    known = [
        # torch 2.13 deprecates `LeafSpec`, which Lightning 2.6's own _pytree helper still uses
        (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, pytree_warning_module()),
        # a fresh fit into a folder of checkpoints is refused, so this shows only on a resume, where it is meant to
        (
            r"Checkpoint directory .* exists and is not empty\.",
            Warning,
            r"lightning\.pytorch\.callbacks\.model_checkpoint",
        ),
        # a 1x1 convolution's strides differ from DDP's bucket only on dimensions of size 1, same memory layout
        (
            r"Grad strides do not match bucket view strides(?s:.*)grad\.sizes\(\) = \[\d+, \d+, 1, 1\],",
            UserWarning,
            r"torch\.autograd\.graph",
        ),
        # a mid-epoch resume: multigpu/checkpoints/continuation.py's own note says it with the epoch, batch and fix
        (
            r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not",
            Warning,
            mid_epoch_resume_warning_module(),
        ),
    ]
    # Lightning's hint to prefix `srun` fires whenever srun is on PATH, also outside a SLURM job
    if "SLURM_JOB_ID" not in os.environ:
        srun_hint = r"The `srun` command is available on your system but is not used"
        known.append((srun_hint, PossibleUserWarning, r"lightning\.fabric\.plugins\.environments\.slurm"))
    return known
