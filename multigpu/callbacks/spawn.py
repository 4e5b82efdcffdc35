"""Give each ``ddp_spawn`` worker its own copy of the module's metric states.

``torch.multiprocessing`` pickles CPU tensors into shared memory. Lightning un-shares the parameters and buffers,
but not torchmetrics' states (plain tensor attributes): until a metric's first ``reset()``, every CPU worker adds
into the same tensors, and the first validation's and epoch's means came out wrong by up to a percent.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn


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
