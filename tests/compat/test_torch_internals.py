"""``multigpu/compat/torch_internals.py``, proven on real torch objects: a compiled module, ``replicate`` and
``scatter``, a ``DataLoader`` iterator's draw, a pipeline stage under a schedule, and a DTensor's local copy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from multigpu import compat


def test_compiled_by_torch_sees_a_compiled_call_and_a_compiled_forward():
    module = nn.Linear(2, 2)
    assert not compat.compiled_by_torch(module)
    module.forward = torch.compile(module.forward, backend="eager")
    assert compat.compiled_by_torch(module)
    other = nn.Linear(2, 2)
    other.compile(backend="eager")
    assert compat.compiled_by_torch(other)


def test_only_children_hides_the_other_children_from_replicate_and_puts_them_back():
    module = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    first = module[0]
    with compat.only_children(module, ["0"]):
        assert [name for name, _ in module.named_children()] == ["0"]
        assert list(module.modules())[1:] == [first]  # what replicate walks and copies
        replica = module._replicate_for_data_parallel()  # how replicate makes each copy: the children it has now
        assert [name for name, _ in replica.named_children()] == ["0"]
    assert [name for name, _ in module.named_children()] == ["0", "1", "2"] and module[0] is first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's replicate copies onto GPUs")
def test_only_children_is_what_replicate_copies_on_a_gpu():
    from torch.nn.parallel import replicate

    module = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)).cuda()
    with compat.only_children(module, ["0"]):
        (replica,) = replicate(module, [0])
    assert [name for name, _ in replica.named_children()] == ["0"]


def test_scatter_to_devices_gives_one_args_tuple_and_one_kwargs_dict_per_device():
    args, kwargs = compat.scatter_to_devices((1, "a"), {"k": 2}, [0, 1])
    assert args == ((1, "a"), (1, "a")) and kwargs == ({"k": 2}, {"k": 2})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch scatters tensors onto GPUs")
def test_scatter_to_devices_cuts_tensors_as_chunk_does():
    batch = torch.arange(5.0)
    args, kwargs = compat.scatter_to_devices((batch,), {"y": batch}, [0] * 3)
    assert [len(a[0]) for a in args] == [len(c) for c in batch.chunk(3)] == [len(k["y"]) for k in kwargs]


def test_draw_loader_base_seed_draws_what_a_loader_iterator_draws():
    loader = DataLoader(TensorDataset(torch.zeros(4)), batch_size=2)  # no generator of its own
    torch.manual_seed(3)
    iter(loader)
    after_iterator = torch.get_rng_state()
    torch.manual_seed(3)
    compat.draw_loader_base_seed()
    assert torch.equal(torch.get_rng_state(), after_iterator)
    torch.manual_seed(3)
    assert not torch.equal(torch.get_rng_state(), after_iterator)  # the iterator did draw


def test_wrapped_stage_work_brackets_each_forward_and_backward_a_schedule_runs_on_the_stage(one_process_group):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(0)
    events: list[str] = []
    module = nn.Linear(4, 2)
    module.register_forward_hook(lambda *args: events.append("forward"))
    module.register_full_backward_hook(lambda *args: events.append("backward"))  # the input requires grad below
    stage = PipelineStage(module, 0, 1, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, 2, loss_fn=lambda output, target: (output - target).pow(2).mean())
    batch = torch.randn(4, 4, requires_grad=True), torch.zeros(4, 2)
    schedule.step(batch[0], target=batch[1])  # the first step also sets the stage up (a forward and a backward)
    events.clear()

    def bracketed(work: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            events.append("start")
            result = work(*args, **kwargs)
            events.append("end")
            return result

        return run

    compat.wrap_stage_work(stage, bracketed)
    schedule.step(batch[0], target=batch[1])
    # GPipe on one stage and two micro-batches: two forwards, then two backwards, each inside its own bracket
    assert events == ["start", "forward", "end"] * 2 + ["start", "backward", "end"] * 2


def test_a_dtensor_of_a_local_copy_keeps_the_layout_and_the_copy(one_process_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
    original = distribute_tensor(torch.arange(6.0).reshape(3, 2), mesh, [Shard(0)])
    local = original.to_local().clone()
    copy = compat.dtensor_of_local(original, local)
    assert isinstance(copy, DTensor) and copy.to_local().data_ptr() == local.data_ptr()
    assert copy.device_mesh == mesh and copy.placements == original.placements and copy.shape == original.shape
    original.to_local().add_(1)  # the training step changes the shard; the copy keeps what it was
    assert torch.equal(copy.full_tensor(), torch.arange(6.0).reshape(3, 2))
