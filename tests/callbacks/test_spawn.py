"""Each ``ddp_spawn`` worker gets its own copy of the module's metric states (multigpu/callbacks/spawn.py). A
``validate``
under ``ddp_spawn`` that counts each sample once is in tests/data/test_evaluation_order.py, on that module's shared
checkpoint."""

from __future__ import annotations

import torch
from torchmetrics import CatMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from multigpu.callbacks.spawn import unshare_module_tensors


class TwoMetrics(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean = MeanMetric()
        self.acc = MulticlassAccuracy(3, average="micro")
        self.alias = self.mean.mean_value  # two names for one tensor, as a MetricCollection's compute group has


def test_torchmetrics_keeps_a_metrics_states_as_attributes_of_the_instance():
    """What ``unshare_module_tensors`` walks: each state is in the metric's own namespace, and compute reads it."""
    mean, collected = MeanMetric(), CatMetric()
    mean.update(torch.tensor([1.0, 3.0]))
    collected.update(torch.tensor([1.0]))
    for metric in (mean, collected):
        assert metric.metric_state and all(vars(metric)[name] is state for name, state in metric.metric_state.items())
    assert isinstance(vars(collected)["value"], list)  # a list state, kept as a list
    mean.mean_value, mean.weight = torch.tensor(10.0), torch.tensor(1.0)  # as the un-sharing replaces them
    assert float(mean.compute()) == 10.0  # what compute reads


def test_metric_states_that_a_spawn_left_in_shared_memory_get_private_copies():
    module = TwoMetrics()
    module.mean.update(torch.tensor([1.0, 3.0]))
    for tensor in (module.mean.mean_value, module.mean.weight, module.acc.tp):
        tensor.share_memory_()  # what torch.multiprocessing does to every tensor it sends to a spawned process
    shared = module.mean.mean_value
    assert unshare_module_tensors(module) == 3
    assert not any(t.is_shared() for t in (module.mean.mean_value, module.mean.weight, module.acc.tp))
    assert module.alias is module.mean.mean_value  # aliases stay one tensor
    module.mean.update(torch.tensor([5.0]))
    assert shared.item() == 4.0  # the shared copy, which the other workers would see, is left alone
    assert module.mean.compute().item() == 3.0
    assert unshare_module_tensors(module) == 0  # nothing shared is left


def test_lightning_unshares_only_parameters_and_buffers_in_spawned_workers():
    """If this fails, Lightning's spawn launcher changed how it copies the module for its workers: check whether
    it now copies metric states too, and whether ``UnshareSpawnedTensors`` is still needed."""
    from lightning.fabric.strategies.launchers.multiprocessing import _disable_module_memory_sharing

    module = TwoMetrics()
    module.linear = torch.nn.Linear(2, 2)
    module.mean.mean_value.share_memory_()
    module.linear.weight.data.share_memory_()
    _disable_module_memory_sharing(module)
    assert not module.linear.weight.is_shared()
    assert module.mean.mean_value.is_shared()  # left shared: the template's callback copies it
