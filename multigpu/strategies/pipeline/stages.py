"""A pipeline process's part of the model: its stages sharded, the other stages' layers replaced."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from multigpu.errors import ConfigurationError


def shard_stages(stages: dict[int, nn.Module], mesh: Any, model_name: str) -> None:
    """Make each stage the FSDP2 root of what ``configure_model`` left unsharded in it (embeddings, head)."""
    # a stage as its own root: the schedules gather and reduce its parameters once per step, not per micro-batch
    for index, stage in stages.items():
        if isinstance(stage, FSDPModule):
            continue
        inner = {id(p) for layer in stage.modules() if isinstance(layer, FSDPModule) for p in layer.parameters()}
        outer = [p for p in stage.parameters() if id(p) not in inner and isinstance(p, DTensor)]
        if any(p.device_mesh.mesh_dim_names == mesh.mesh_dim_names for p in outer):
            raise ConfigurationError(
                f"{model_name}.configure_model sharded a module around the layers of pipeline stage {index} (e.g."
                " fully_shard(self.net), the whole network), which under --trainer.strategy=pipeline no process"
                " runs. Fix: shard only the layers (each block) when self.device_mesh has a 'pipeline' dimension,"
                " the strategy shards the rest of each stage.",
                every_rank=True,
            )
        fully_shard(stage, mesh=mesh)


class HeldElsewhere(nn.Module):
    """Stands in for a layer another pipeline process holds; the kept parameters keep one device's names."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "this layer is held by another pipeline process: under --trainer.strategy=pipeline the strategy runs the"
            " stages (pipeline_stage), not the whole model"
        )


def remove_other_stages(module: nn.Module, stages: list[nn.Module]) -> None:
    """Replace each submodule of ``module`` that holds state and that none of ``stages`` runs by ``HeldElsewhere``."""
    used = {id(layer) for stage in stages for layer in stage.modules()}

    def prune(parent: nn.Module) -> None:
        for name, child in list(parent.named_children()):
            if id(child) in used:
                continue
            if any(id(layer) in used for layer in child.modules()):
                prune(child)
            elif next(child.parameters(), None) is not None or next(child.buffers(), None) is not None:
                setattr(parent, name, HeldElsewhere())

    prune(module)


def tied_parameter_names(module: nn.Module) -> list[tuple[str, str]]:
    """Pairs ``(first name, other name)`` of one parameter registered under two names (a tied weight)."""
    first_name: dict[int, str] = {}
    pairs = []
    for name, parameter in module.named_parameters(remove_duplicate=False):
        if id(parameter) in first_name:
            pairs.append((first_name[id(parameter)], name))
        else:
            first_name[id(parameter)] = name
    return pairs
