"""How ``--trainer.strategy=fsdp2`` shards a model that has no ``configure_model`` hook.

The default policy makes each child module of the LightningModule that holds parameters one FSDP2 unit
(``fully_shard``): its parameters, gradients and optimizer state are split over the data-parallel ranks and
gathered only while that child runs. Parameters held by the LightningModule itself (not by a child) are
sharded with the LightningModule as the root unit. Metrics and other children without parameters stay as they
are.

One unit per child is coarse: a model kept in one child (``self.net``) is gathered whole for its forward, so
the sharding saves the memory of gradients and optimizer state, not of the parameters during the step. A large
model shards finer in its own hook, one unit per block, then the whole::

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for block in self.net.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.net, mesh=mesh)
"""

from __future__ import annotations

import types

from lightning.pytorch import LightningModule
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard


def holds_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def shard_by_children(module: LightningModule) -> None:
    """Apply the default policy to ``module`` on its device mesh's data-parallel dimension (idempotent)."""
    if any(isinstance(child, FSDPModule) for child in module.modules()):
        return  # already sharded: Lightning calls configure_model again for test/predict after fit
    mesh = module.device_mesh["data_parallel"]
    for child in module.children():
        if holds_parameters(child):
            fully_shard(child, mesh=mesh)
    if next(module.parameters(recurse=False), None) is not None:
        # the module's own parameters need a unit; it runs them only inside its forward, the root's trigger
        fully_shard(module, mesh=mesh)


class DefaultShardingPolicy:
    """Gives a LightningModule without ``configure_model`` the default policy as its hook, for one run.

    Lightning calls ``configure_model`` after the processes and the device mesh exist, and the strategy requires
    the hook; binding it to the instance (not the class) keeps the user's class and checkpoints unchanged.
    """

    def __init__(self, module: LightningModule) -> None:
        self.module = module

    @classmethod
    def install(cls, module: LightningModule) -> DefaultShardingPolicy:
        # an attribute of the instance: Lightning calls the hook, and checks that it exists, through the instance
        module.configure_model = types.MethodType(shard_by_children, module)
        return cls(module)

    def uninstall(self) -> None:
        vars(self.module).pop("configure_model", None)  # the class's hook again
