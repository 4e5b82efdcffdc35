"""The strategies the engine adds are registered in one place (``multigpu.strategies.STRATEGIES``): after
``register_strategies()`` each name builds its class through Lightning's registry, with its description, and the
registration functions of 1.0 and 1.1 still register them."""

from __future__ import annotations

import lightning as L
import pytest
from lightning.pytorch.strategies import StrategyRegistry

import multigpu.strategies as strategies
from multigpu.strategies import STRATEGIES, register_strategies


@pytest.fixture
def unregistered():
    """Lightning's registry without the engine's names for the test, and as it was after it."""
    saved = {name: StrategyRegistry.pop(name) for name in STRATEGIES if name in StrategyRegistry}
    yield
    for name in STRATEGIES:
        StrategyRegistry.pop(name, None)
    StrategyRegistry.update(saved)


def test_each_name_builds_its_class_through_lightnings_registry(unregistered):
    assert not set(STRATEGIES) & set(StrategyRegistry.available_strategies())
    register_strategies()
    register_strategies()  # idempotent: a second TemplateCLI in one process
    assert set(STRATEGIES) == {"dp", "fsdp2", "tensor_parallel", "pipeline"}
    for name, (strategy, description) in STRATEGIES.items():
        assert type(StrategyRegistry.get(name)) is strategy, name
        assert StrategyRegistry[name]["description"] == description and description, name
    trainer = L.Trainer(strategy="dp", accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    assert type(trainer.strategy) is strategies.DataParallelStrategy


@pytest.mark.parametrize(
    "old", ["register_dp_strategy", "register_model_parallel_strategies", "register_pipeline_strategy"]
)
def test_the_registration_functions_of_earlier_versions_register_every_strategy(unregistered, old):
    getattr(strategies, old)()
    assert set(STRATEGIES) <= set(StrategyRegistry.available_strategies())
