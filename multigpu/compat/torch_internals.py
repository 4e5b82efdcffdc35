"""The names of torch the engine relies on that torch does not document as public (re-exported by ``compat``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn


def compiled_by_torch(module: nn.Module) -> bool:
    """Whether ``module.compile()`` compiled the module's call, or its own ``forward`` is a ``torch.compile`` result."""
    forward = vars(module).get("forward")
    return module._compiled_call_impl is not None or hasattr(forward, "_torchdynamo_orig_callable")


@contextlib.contextmanager
def only_children(module: nn.Module, names: Collection[str]) -> Iterator[None]:
    """``module`` has only the children ``names`` within, so that ``nn.parallel.replicate`` copies only those."""
    children = module._modules
    module._modules = {name: child for name, child in children.items() if name in names or child is None}
    try:
        yield
    finally:
        module._modules = children


def scatter_to_devices(args: tuple, kwargs: dict[str, Any], devices: Sequence[int | None]) -> tuple[tuple, tuple]:
    """``forward``'s arguments cut for each device as ``nn.DataParallel`` cuts them (``scatter_kwargs``)."""
    from torch.nn.parallel.scatter_gather import scatter_kwargs

    return scatter_kwargs(args, kwargs, list(devices), dim=0)


def draw_loader_base_seed() -> None:
    """Draw what a ``DataLoader`` iterator without a generator draws from the global one (its private base seed)."""
    torch.empty((), dtype=torch.int64).random_()


#: a stage's own work on one micro-batch: the schedule's waits for its neighbours lie between these calls
STAGE_WORK = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


def wrap_stage_work(stage: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace each piece of ``stage``'s own work with ``wrap`` of it, on this stage only, whatever the schedule."""
    for name in STAGE_WORK:
        setattr(stage, name, wrap(getattr(stage, name)))


def dtensor_of_local(like: Any, local: Tensor) -> Any:
    """A DTensor of ``like``'s layout on ``local`` where it lies: ``DTensor.from_local`` would move it and sync."""
    from torch.distributed.tensor import DTensor

    return DTensor(local, like._spec, requires_grad=False)
