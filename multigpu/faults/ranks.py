"""What each rank of a multi-process run needs beyond Lightning, one callback each."""

from __future__ import annotations

import atexit

import lightning as L
import torch
import torch.distributed as dist
from torch import nn

from multigpu.compat import release_started_processes
from multigpu.errors import TrainingStopped
from multigpu.errors.reporting import speak_for_the_run
from multigpu.faults.processes import wait_for_exit


def unshare_module_tensors(module: nn.Module) -> int:
    """Replace every shared CPU tensor attribute with a private copy, aliases kept aliases; return how many."""
    copies: dict[int, torch.Tensor] = {}

    def private(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "cpu" or not tensor.is_shared():
            return tensor
        if id(tensor) not in copies:
            copies[id(tensor)] = tensor.detach().clone()
        return copies[id(tensor)]

    for submodule in module.modules():
        # torchmetrics' states are plain attributes, neither parameters nor buffers
        for name, value in list(vars(submodule).items()):
            if isinstance(value, torch.Tensor):
                setattr(submodule, name, private(value))
            elif isinstance(value, list):
                value[:] = [private(v) if isinstance(v, torch.Tensor) else v for v in value]
    return len(copies)


class UnshareSpawnedTensors(L.Callback):
    """Private metric states in each ``ddp_spawn`` worker: Lightning un-shares parameters and buffers, not these."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            unshare_module_tensors(pl_module)


STOPPED_RANKS_GRACE_S = 60.0


class StopOtherRanksOnError(L.Callback):
    """When the first process fails, SIGKILL the ranks it started (one in a collective ignores SIGTERM)."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if trainer.world_size == 1:
            return
        if isinstance(exception, TrainingStopped):
            # every rank agreed to stop and saves: exit after them, so the job's status is this one's
            atexit.register(wait_for_exit, release_started_processes(trainer), STOPPED_RANKS_GRACE_S)
            return
        speak_for_the_run(trainer)
        for process in release_started_processes(trainer):
            process.kill()


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class DestroyProcessGroupAtExit(L.Callback):
    """Destroy the process group at exit: a live gloo group can abort the interpreter's finalisation."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        atexit.unregister(destroy_process_group)
        atexit.register(destroy_process_group)
