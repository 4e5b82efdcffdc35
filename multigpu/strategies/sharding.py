"""How ``strategy="fsdp2"`` shards a model without a ``configure_model`` hook: each child module that holds
parameters is one FSDP2 unit, the LightningModule the root (docs/models.md says how to shard finer)."""

from __future__ import annotations

import types

from lightning.pytorch import LightningModule
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard


def holds_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def shard_by_children(module: LightningModule) -> None:
    if any(isinstance(child, FSDPModule) for child in module.modules()):
        return  # already sharded: Lightning calls configure_model again for test/predict after fit
    mesh = module.device_mesh["data_parallel"]
    for child in module.children():
        if holds_parameters(child):
            fully_shard(child, mesh=mesh)
    if next(module.parameters(recurse=False), None) is not None:
        # its own parameters run only inside its forward, the root unit's trigger
        fully_shard(module, mesh=mesh)


class DefaultShardingPolicy:
    """Gives a LightningModule without ``configure_model`` the default policy as its hook, for one run."""

    def __init__(self, module: LightningModule) -> None:
        self.module = module

    @classmethod
    def install(cls, module: LightningModule) -> DefaultShardingPolicy:
        # on the instance: the user's class stays as it is
        module.configure_model = types.MethodType(shard_by_children, module)
        return cls(module)

    def uninstall(self) -> None:
        vars(self.module).pop("configure_model", None)
