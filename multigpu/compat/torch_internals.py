"""The names of torch that the engine relies on and torch does not document as public: a module's compiled call and
child registry, the scatter of ``nn.DataParallel``, a ``DataLoader`` iterator's seed draw, a pipeline stage's work and
a DTensor's layout. Re-exported by ``multigpu/compat/__init__.py``, where the rest of the list is."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

# -- torch and torchmetrics ---------------------------------------------------------------------------------


def compiled_by_torch(module: nn.Module) -> bool:
    """Whether ``module.compile()`` compiled the module's call, or its ``forward`` is a ``torch.compile`` result:
    compiling either again would trace a compiled function."""
    forward = vars(module).get("forward")  # a forward of the module's own, put on the instance
    return module._compiled_call_impl is not None or hasattr(forward, "_torchdynamo_orig_callable")


@contextlib.contextmanager
def only_children(module: nn.Module, names: Collection[str]) -> Iterator[None]:
    """Within the block, ``module`` has only the child modules ``names`` (and its own parameters and buffers).

    ``nn.parallel.replicate`` copies every module below the one it gets; this is how dp copies only the children
    ``forward`` uses. The registry of children (``_modules``) is swapped, not rebuilt, so identities stay.
    """
    children = module._modules
    module._modules = {name: child for name, child in children.items() if name in names or child is None}
    try:
        yield
    finally:
        module._modules = children


def scatter_to_devices(args: tuple, kwargs: dict[str, Any], devices: Sequence[int | None]) -> tuple[tuple, tuple]:
    """``forward``'s arguments cut for each device, as ``nn.DataParallel`` cuts them: every tensor in chunks along
    dim 0, anything else repeated; one ``args`` tuple and one ``kwargs`` dict per device (torch's ``scatter_kwargs``,
    which ``torch.nn.parallel`` does not export)."""
    from torch.nn.parallel.scatter_gather import scatter_kwargs

    return scatter_kwargs(args, kwargs, list(devices), dim=0)


def draw_loader_base_seed() -> None:
    """Draw from the global generator what creating a torch ``DataLoader`` iterator draws when the loader has no
    generator of its own (its workers' base seed, drawn by the iterator's private base class)."""
    torch.empty((), dtype=torch.int64).random_()


# -- torch.distributed.pipelining: a stage's work -------------------------------------------------------------

#: what a schedule of ``torch.distributed.pipelining`` calls on a ``PipelineStage`` for the stage's own work on one
#: micro-batch (its forward; its backward; the weight half of a split backward): the schedule's waits for the
#: neighbouring stages lie between these calls, which its public API does not time
STAGE_WORK = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


def wrap_stage_work(stage: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace each piece of ``stage``'s own work (``STAGE_WORK``) with ``wrap`` of it, on this stage only, whichever
    schedule calls it. Relied on: the schedules call these methods on the stage object, after waiting for its inputs
    and before sending its outputs."""
    for name in STAGE_WORK:
        setattr(stage, name, wrap(getattr(stage, name)))


# -- torch.distributed.tensor ------------------------------------------------------------------------------------


def dtensor_of_local(like: Any, local: Tensor) -> Any:
    """A DTensor of ``like``'s layout (mesh, placements, global shape) whose local shard is ``local``, wherever that
    lies: the host copy of a shard for an asynchronous checkpoint. ``DTensor.from_local`` moves a shard onto the
    mesh's device (a GPU's state would go back to the GPU) and checks the layout with collectives; the constructor
    with ``like``'s spec (``_spec``) does neither, as ``torch.distributed.checkpoint``'s own stager does."""
    from torch.distributed.tensor import DTensor

    return DTensor(local, like._spec, requires_grad=False)
