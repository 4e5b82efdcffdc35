"""What each rank of a multi-process run needs beyond Lightning, one callback each, all acting only where there are
several processes:

- ``UnshareSpawnedTensors``: each ``ddp_spawn`` worker gets its own copy of the module's metric states.
  ``torch.multiprocessing`` pickles CPU tensors into shared memory; Lightning un-shares the parameters and buffers,
  but not torchmetrics' states (plain tensor attributes): until a metric's first ``reset()``, every CPU worker adds
  into the same tensors, and the first validation's and epoch's means came out wrong by up to a percent.
- ``StopOtherRanksOnError``: when the first process fails, the ranks it started are stopped, so that they do not
  wait in their next collective until it times out; after a stop every rank agreed on, they are waited for.
- ``DestroyProcessGroupAtExit``: the process group destroyed before the interpreter exits. A process that exits with
  its gloo group alive can abort while the interpreter finalises (SIGABRT after a successful run: gloo's threads
  hold tensors that need the GIL); neither torch nor Lightning destroys it.
"""

from __future__ import annotations

import atexit

import lightning as L
import torch
import torch.distributed as dist
from torch import nn

from multigpu.compat import release_started_processes
from multigpu.errors import TrainingStopped
from multigpu.processes import wait_for_exit
from multigpu.reporting import speak_for_the_run

# -- ddp_spawn: private metric states ----------------------------------------------------------------------------------


def unshare_module_tensors(module: nn.Module) -> int:
    """Replace every CPU tensor attribute of ``module`` and its submodules (torchmetrics states among them) that
    lives in shared memory with a private copy; return how many were copied.

    Tensors that were one object stay one object (a ``MetricCollection``'s compute groups alias their states),
    and a list state keeps its identity, only its shared elements are copied.
    """
    copies: dict[int, torch.Tensor] = {}

    def private(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "cpu" or not tensor.is_shared():
            return tensor
        if id(tensor) not in copies:
            copies[id(tensor)] = tensor.detach().clone()
        return copies[id(tensor)]

    for submodule in module.modules():
        # torchmetrics keeps a metric's states as plain attributes of the instance (neither parameters nor buffers)
        for name, value in list(vars(submodule).items()):
            if isinstance(value, torch.Tensor):
                setattr(submodule, name, private(value))
            elif isinstance(value, list):
                value[:] = [private(v) if isinstance(v, torch.Tensor) else v for v in value]
    return len(copies)


class UnshareSpawnedTensors(L.Callback):
    """At setup, before any metric update and before a checkpoint is loaded, un-share the module's tensor
    attributes that a spawn launcher left in shared memory (see ``unshare_module_tensors``)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size > 1:  # one process shares nothing
            unshare_module_tensors(pl_module)


# -- a failed rank: the others stopped ---------------------------------------------------------------------------------

#: how long the first process waits at exit for the ranks it started to finish an agreed stop
STOPPED_RANKS_GRACE_S = 60.0


class StopOtherRanksOnError(L.Callback):
    """When the first process fails, stop the ranks it started before it reports, or they would wait in their next
    collective until the timeout. SIGKILL, as Lightning uses on Ctrl-C: a rank inside a collective ignores SIGTERM.
    """

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if trainer.world_size == 1:  # one process has no other ranks to stop
            return
        if isinstance(exception, TrainingStopped):
            # every rank agreed to stop at this step and exits with the same status after saving: let them finish
            # (their shards and logs), and exit after them, so the job's status is this one's
            atexit.register(wait_for_exit, release_started_processes(trainer), STOPPED_RANKS_GRACE_S)
            return
        # this process reports for the run (a report a rank hands over from now on is not printed), and the ranks
        # leave Lightning's watch first: its observer thread SIGKILLs this process when one of them exits on the
        # signal, which can come before this process reports and exits with its own status
        speak_for_the_run(trainer)
        for process in release_started_processes(trainer):
            process.kill()


# -- exit: the process group destroyed ---------------------------------------------------------------------------------


def destroy_process_group() -> None:
    """Destroy the default process group (and every group made from it), if this process has one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class DestroyProcessGroupAtExit(L.Callback):
    """Registers ``destroy_process_group`` to run at the exit of each rank's process (once per process)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        atexit.unregister(destroy_process_group)  # a second run in the same process registers it once
        atexit.register(destroy_process_group)
