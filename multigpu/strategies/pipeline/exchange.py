"""What the processes of a pipeline exchange outside torch's schedules: evaluation's forward and the gradients of
tied weights. An activation goes after a header of its dtype and shape, so that the receiver can allocate it."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor


def forward_through_stages(
    stages: dict[int, nn.Module],
    inputs: Tensor,
    group: dist.ProcessGroup,
    rank: int,
    ranks: int,
    count: int,
    device: torch.device,
) -> Tensor:
    """The model's forward through its ``count`` stages, its output on every process of the pipeline ``group``."""
    x: Tensor | None = inputs
    for index, stage in stages.items():
        if index > 0 and (index - 1) % ranks != rank:
            x = _receive(group, (index - 1) % ranks, device)
        x = stage(x)
        if index < count - 1 and (index + 1) % ranks != rank:
            _send(x, group, (index + 1) % ranks)
    output = x if rank == ranks - 1 else None
    shape, dtype = _broadcast_header(output, group, src=ranks - 1, device=device)
    output = output if output is not None else torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(output, group=group, group_src=ranks - 1)
    return output


def sum_tied_gradients(
    held: list[nn.Parameter | None],
    new: dict[nn.Parameter, Tensor | None],
    group: dist.ProcessGroup,
    ranks: int,
    device: torch.device,
) -> None:
    """Sum each tied weight's gradients over its two ends, the first and the last rank (the others add zeros)."""
    if ranks == 1:
        return
    for parameter in held:
        grad = new.get(parameter) if parameter is not None else None
        local = _local(grad) if grad is not None else None
        shape, dtype = _broadcast_header(local, group, src=ranks - 1, device=device)
        dist.all_reduce(local if local is not None else torch.zeros(shape, dtype=dtype, device=device), group=group)


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32)
_HEADER = 8  # dtype, number of dimensions, up to 6 sizes


def _header(tensor: Tensor, device: torch.device) -> Tensor:
    sizes = list(tensor.shape) + [0] * (_HEADER - 2 - tensor.dim())
    return torch.tensor([_DTYPES.index(tensor.dtype), tensor.dim(), *sizes], dtype=torch.int64, device=device)


def _read_header(header: Tensor) -> tuple[torch.Size, torch.dtype]:
    values = header.tolist()
    return torch.Size(values[2 : 2 + values[1]]), _DTYPES[values[0]]


def _send(tensor: Tensor, group: dist.ProcessGroup, to: int) -> None:
    tensor = tensor.contiguous()
    dist.send(_header(tensor, tensor.device), group=group, group_dst=to)
    dist.send(tensor, group=group, group_dst=to)


def _receive(group: dist.ProcessGroup, source: int, device: torch.device) -> Tensor:
    header = torch.empty(_HEADER, dtype=torch.int64, device=device)
    dist.recv(header, group=group, group_src=source)
    shape, dtype = _read_header(header)
    tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(tensor, group=group, group_src=source)
    return tensor


def _broadcast_header(tensor: Tensor | None, group: dist.ProcessGroup, src: int, device: torch.device) -> tuple:
    header = _header(tensor, device) if tensor is not None else torch.empty(_HEADER, dtype=torch.int64, device=device)
    dist.broadcast(header, group=group, group_src=src)
    return _read_header(header)
