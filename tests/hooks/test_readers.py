"""The engine's reads of the hooks (``multigpu/hooks/readers.py``): each through its Protocol, a model without it
trains as before."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from multigpu import ConfigurationError, hooks
from multigpu.hooks import readers as hook_readers


class Declared(nn.Module):
    flops_per_sample = 6.0


class Computed(nn.Module):
    def flops_per_batch(self) -> float:
        return 12.0


def test_the_flops_hook_is_an_attribute_or_a_method_and_absent_is_none():
    assert hook_readers.module_flops(Declared()) == ("flops_per_sample", 6.0)
    assert hook_readers.module_flops(Computed()) == ("flops_per_batch", 12.0)
    assert hook_readers.module_flops(nn.Linear(2, 2)) is None
    assert isinstance(Declared(), hooks.CountsFlops) and isinstance(Computed(), hooks.CountsFlopsPerBatch)
    assert not isinstance(Computed(), hooks.CountsFlops)  # each Protocol declares the name it reads


class Stage(nn.Sequential):
    """A pipeline stage that says which blocks it runs."""

    def layers(self) -> list[nn.Module]:
        return list(self)


class Blocks(nn.Module):
    """Two blocks with every optional hook: the three of ``pipeline`` and a check of its data module's sequences."""

    def __init__(self, block_size: int = 8) -> None:
        super().__init__()
        self.block_size = block_size
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def pipeline_stage(self, index: int, count: int) -> nn.Module:
        return Stage(*self.blocks[index * 2 // count : (index + 1) * 2 // count])

    def pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output, target)

    def model_step(self, batch: Any) -> torch.Tensor:
        inputs, target = batch
        return self.pipeline_loss(self.blocks[1](self.blocks[0](inputs)), target)

    def check_datamodule(self, datamodule: Any) -> None:
        if datamodule.block_size > self.block_size:
            raise ConfigurationError(f"block_size={datamodule.block_size} is longer than the model's {self.block_size}")


def test_the_pipeline_hooks_a_model_lacks_are_named():
    assert hook_readers.missing_pipeline_hooks(nn.Linear(2, 2)) == list(hooks.PIPELINE_HOOKS)
    staged = Blocks()
    assert hook_readers.missing_pipeline_hooks(staged) == []
    assert isinstance(staged, hooks.Pipelined)
    assert tuple(name for name in vars(hooks.Pipelined) if not name.startswith("_")) == hooks.PIPELINE_HOOKS
    assert hook_readers.stage_layer_count(staged.pipeline_stage(0, 2)) == 1
    assert hook_readers.stage_layer_count(staged.pipeline_stage(0, 1)) == 2
    assert hook_readers.stage_layer_count(nn.Linear(2, 2)) is None


def test_a_models_own_check_of_its_data_module_runs_and_refuses_in_one_paragraph():
    staged = Blocks(block_size=8)

    class Data:
        block_size = 16

    with pytest.raises(ConfigurationError, match=r"block_size=16 is longer than the model.s 8"):
        hook_readers.check_datamodule(staged, Data())
    Data.block_size = 8
    hook_readers.check_datamodule(staged, Data())  # fits: nothing raised
    hook_readers.check_datamodule(nn.Linear(2, 2), Data())  # no hook: nothing checked
