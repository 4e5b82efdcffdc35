"""What the tests of multigpu/strategies/pipeline/ share: a model of three stages with a tied weight, and a real
one-process process group."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh


class Chain(nn.Module):
    """An embedding, three linear layers and an output layer tied to the embedding; stage ``i`` of 3 runs layer
    ``i``, the first also the embedding, the last also the output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(3))
        self.out = nn.Linear(3, 5, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(()))

    def pipeline_stage(self, index: int, count: int) -> nn.Module:
        first = [self.embed] if index == 0 else []
        return nn.Sequential(*first, self.layers[index], *([self.out] if index == count - 1 else []))


@pytest.fixture
def process_group(tmp_path) -> Iterator[dist.ProcessGroup]:
    """A real (gloo, one process) process group."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def data_parallel_mesh(process_group) -> object:
    """The process group's one-rank data-parallel mesh."""
    return init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
