"""The engine's reads of the hooks (``multigpu/hook_readers.py``): each through its Protocol, a model without it
trains as before."""

from __future__ import annotations

import pytest
from torch import nn

from multigpu import ConfigurationError, hook_readers, hooks
from src.models.gpt import CausalLanguageModel


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


def test_the_pipeline_hooks_a_model_lacks_are_named():
    assert hook_readers.missing_pipeline_hooks(nn.Linear(2, 2)) == list(hooks.PIPELINE_HOOKS)
    gpt = CausalLanguageModel(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
    assert hook_readers.missing_pipeline_hooks(gpt) == []
    assert isinstance(gpt, hooks.Pipelined)
    assert tuple(name for name in vars(hooks.Pipelined) if not name.startswith("_")) == hooks.PIPELINE_HOOKS
    assert hook_readers.stage_layer_count(gpt.pipeline_stage(0, 2)) == 1
    assert hook_readers.stage_layer_count(nn.Linear(2, 2)) is None


def test_a_models_own_check_of_its_data_module_runs_and_refuses_in_one_paragraph():
    gpt = CausalLanguageModel(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)

    class Data:
        block_size = 16

    with pytest.raises(ConfigurationError, match=r"block_size=16 is longer than the model.s .*block_size=8"):
        hook_readers.check_datamodule(gpt, Data())
    Data.block_size = 8
    hook_readers.check_datamodule(gpt, Data())  # fits: nothing raised
    hook_readers.check_datamodule(nn.Linear(2, 2), Data())  # no hook: nothing checked
