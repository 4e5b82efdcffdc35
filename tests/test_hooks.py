"""What a model may implement (``multigpu/hooks.py``): each hook is read by the feature the table names, through the
helpers there, and a model without it trains as before."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from torch import nn

from multigpu import ConfigurationError, hooks
from src.models.gpt import CausalLanguageModel
from tests.conftest import REPO


class Declared(nn.Module):
    flops_per_sample = 6.0


class Computed(nn.Module):
    def flops_per_batch(self) -> float:
        return 12.0


def test_the_flops_hook_is_an_attribute_or_a_method_and_absent_is_none():
    assert hooks.module_flops(Declared()) == ("flops_per_sample", 6.0)
    assert hooks.module_flops(Computed()) == ("flops_per_batch", 12.0)
    assert hooks.module_flops(nn.Linear(2, 2)) is None
    assert isinstance(Declared(), hooks.CountsFlops)


def test_the_pipeline_hooks_a_model_lacks_are_named():
    assert hooks.missing_pipeline_hooks(nn.Linear(2, 2)) == list(hooks.PIPELINE_HOOKS)
    gpt = CausalLanguageModel(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
    assert hooks.missing_pipeline_hooks(gpt) == []
    assert isinstance(gpt, hooks.Pipelined)
    assert hooks.stage_layer_count(gpt.pipeline_stage(0, 2)) == 1
    assert hooks.stage_layer_count(nn.Linear(2, 2)) is None


def test_a_models_own_check_of_its_data_module_runs_and_refuses_in_one_paragraph():
    gpt = CausalLanguageModel(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)

    class Data:
        block_size = 16

    with pytest.raises(ConfigurationError, match=r"block_size=16 is longer than the model.s .*block_size=8"):
        hooks.check_datamodule(gpt, Data())
    Data.block_size = 8
    hooks.check_datamodule(gpt, Data())  # fits: nothing raised
    hooks.check_datamodule(nn.Linear(2, 2), Data())  # no hook: nothing checked


def test_the_engine_reads_every_hook_name_only_here():
    """A hook's name as a string literal anywhere else in the engine would be a hook this module does not list."""
    names = {*hooks.FLOPS_HOOKS, hooks.DP_MODULES, *hooks.PIPELINE_HOOKS, hooks.CHECK_DATAMODULE}
    found = []
    for path in sorted((REPO / "multigpu").rglob("*.py")):
        if path.name == "hooks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr"):
                literal = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
                found += [f"{Path(path).relative_to(REPO)}:{node.lineno}: {v}" for v in literal if v in names]
    assert not found, found
