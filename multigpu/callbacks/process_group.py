"""Destroy the process group before the interpreter exits, on every rank of a multi-process run.

A process that exits with its gloo group alive can abort while the interpreter finalises (SIGABRT after a
successful run: gloo's threads hold tensors that need the GIL); neither torch nor Lightning destroys it.
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
