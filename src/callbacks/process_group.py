"""Destroy the process group before the interpreter exits, on every rank of a multi-process run.

A process that exits with its gloo process group alive can abort while the interpreter finalises ("terminate
called without an active exception", SIGABRT, after the run itself succeeded): gloo's worker threads still hold
work objects whose tensors need the GIL to be released. torch does not destroy the group at exit, and Lightning
leaves it alive after a run (a script may start another), so each rank registers ``destroy_process_group`` to run
at exit, while the interpreter is still whole.
"""

from __future__ import annotations

import atexit

import lightning as L
import torch.distributed as dist


def destroy_process_group() -> None:
    """Destroy the default process group (and every group made from it), if this process has one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class DestroyProcessGroupAtExit(L.Callback):
    """Registers ``destroy_process_group`` to run at the exit of each rank's process (once per process)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        atexit.unregister(destroy_process_group)  # a second run in the same process registers it once
        atexit.register(destroy_process_group)
