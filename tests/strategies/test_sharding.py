"""How ``fsdp2`` shards a model without a ``configure_model`` hook (multigpu/strategies/sharding.py): each child holding
parameters one unit, the module itself one for parameters of its own, bound to the instance for one run only. That
such a run trains the model one device trains is tested in tests/strategies/test_model_parallel.py, on that
module's shared runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from multigpu.strategies.sharding import DefaultShardingPolicy
from tests.fixtures.workload import TinyClassifier


def test_default_policy_is_bound_for_one_run_only():
    model = TinyClassifier()
    policy = DefaultShardingPolicy.install(model)
    assert is_overridden("configure_model", model)
    policy.uninstall()
    assert not is_overridden("configure_model", model)
    assert "configure_model" not in vars(model)


@pytest.fixture
def data_parallel_mesh(tmp_path) -> Iterator[DeviceMesh]:
    """A real (gloo, one process) process group and its one-rank data-parallel mesh."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
    finally:
        dist.destroy_process_group()


class ScaledClassifier(TinyClassifier):
    """The tests' classifier with a parameter of its own, held by no child."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.scale * super().forward(inputs)


@pytest.mark.parametrize("model_class", [TinyClassifier, ScaledClassifier])
def test_each_child_with_parameters_is_a_unit_and_the_module_one_for_its_own(model_class, data_parallel_mesh):
    model = model_class()
    model._device_mesh = data_parallel_mesh  # what the strategy sets before it calls configure_model
    policy = DefaultShardingPolicy.install(model)
    model.configure_model()
    units = [name for name, child in model.named_children() if isinstance(child, FSDPModule)]
    assert units == ["net"]  # the metrics hold no parameters: left as they are
    assert isinstance(model, FSDPModule) is (model_class is ScaledClassifier)
    assert all(isinstance(parameter, DTensor) for parameter in model.parameters())
    # Lightning calls the hook again for test and predict after fit: a second fully_shard of a unit would raise
    model.configure_model()
    policy.uninstall()
    assert model(torch.randn(3, 16)).shape == (3, 4)  # each unit gathers its parameters for its forward
