"""``multigpu/strategies/pipeline/stages.py``: the removal of other stages' layers, each stage the FSDP2 root of
its rest, tied weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from multigpu.errors import ConfigurationError
from multigpu.strategies.pipeline.options import check_stages
from multigpu.strategies.pipeline.stages import HeldElsewhere, remove_other_stages, shard_stages, tied_parameter_names
from tests.strategies.pipeline.conftest import Chain


def test_a_process_keeps_its_stages_layers_under_their_names_and_placeholders_for_the_others():
    model = Chain()
    check_stages(model, 3)  # every parameter in a stage, the model unchanged
    stages = [model.pipeline_stage(index, 3) for index in (0, 2)]  # rank 0 of 2 ranks holding stages 0 and 2
    remove_other_stages(model, stages)
    assert [name for name, _ in model.named_parameters()] == [
        "embed.weight", "layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"
    ]  # fmt: skip
    assert isinstance(model.layers[1], HeldElsewhere) and not list(model.layers[1].parameters())
    assert model.out is stages[1][-1]  # the last stage's output layer stays: a stage of this process runs it
    with pytest.raises(RuntimeError, match="held by another pipeline process"):
        model.layers[1](torch.zeros(3))
    middle = Chain()
    remove_other_stages(middle, [middle.pipeline_stage(1, 3)])
    assert [name for name, _ in middle.named_parameters()] == ["layers.1.weight", "layers.1.bias"]
    assert list(dict(middle.named_buffers())) == ["scale"]  # a buffer of the model itself stays


def test_each_stage_becomes_the_root_of_its_rest_and_a_sharded_whole_network_is_refused(data_parallel_mesh):
    model = Chain()
    stages = {index: model.pipeline_stage(index, 3) for index in (0, 2)}
    remove_other_stages(model, list(stages.values()))
    for layer in (model.layers[0], model.layers[2]):  # what a configure_model does: the layers
        fully_shard(layer, mesh=data_parallel_mesh)
    shard_stages(stages, data_parallel_mesh, "Chain")
    assert all(isinstance(stage, FSDPModule) for stage in stages.values())
    assert all(isinstance(parameter, torch.distributed.tensor.DTensor) for parameter in model.parameters())
    tokens = torch.tensor([1, 2])
    assert stages[2](stages[0](tokens)).shape == (2, 5)  # the stages run, each gathering its own parameters

    whole = Chain()
    stages = {index: whole.pipeline_stage(index, 3) for index in (0, 2)}
    remove_other_stages(whole, list(stages.values()))
    fully_shard(whole, mesh=data_parallel_mesh)  # the root of a network no process runs whole
    with pytest.raises(
        ConfigurationError, match=r"Chain\.configure_model sharded a module around the layers of pipeline"
    ):
        shard_stages(stages, data_parallel_mesh, "Chain")


def test_a_tied_weight_is_found_under_both_names():
    net = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    assert tied_parameter_names(net) == []
    net[1].weight = net[0].weight
    assert tied_parameter_names(net) == [("0.weight", "1.weight")]
