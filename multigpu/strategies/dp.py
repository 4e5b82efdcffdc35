"""``strategy="dp"``, which Lightning 2.x removed: one process, each forward's batch split across the GPUs and the
outputs gathered on the first, the module never wrapped (docs/strategies.md)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torch.nn.parallel import gather, parallel_apply, replicate
from torchmetrics import Metric, MetricCollection

from multigpu.compat import only_children, scatter_to_devices
from multigpu.hooks import DP_MODULES, ReplicatesForDataParallel


def _scattered_tensors(obj: Any) -> Iterator[Tensor]:
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _scattered_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.items():
            yield from _scattered_tensors(item)


def chunk_sizes(args: tuple, kwargs: dict, num_devices: int) -> list[int]:
    """Sizes of the chunks ``scatter`` cuts the batch into (``Tensor.chunk``'s sizes); ``[]`` without tensors."""
    # torch's scatter zips each tensor's pieces: another size along dim 0 would silently drop samples
    tensors = list(_scattered_tensors((args, kwargs)))
    if not tensors:
        return []
    if any(tensor.dim() == 0 for tensor in tensors):
        raise ValueError(
            "--trainer.strategy=dp splits every tensor argument of forward along dim 0, but forward got a 0-dim"
            " tensor. Fix: pass it as a Python number, or give it a batch dimension."
        )
    sizes = {tensor.shape[0] for tensor in tensors}
    if len(sizes) > 1:
        raise ValueError(
            "--trainer.strategy=dp splits every tensor argument of forward along dim 0 (the batch), but they have"
            f" different sizes there: {sorted(sizes)}. Fix: pass only batch tensors to forward; keep tensors"
            " shared by all samples on the module (a parameter or a registered buffer), which dp copies to every"
            " GPU."
        )
    batch = sizes.pop()
    per_chunk = max(1, math.ceil(batch / num_devices))
    return [min(per_chunk, batch - start) for start in range(0, batch, per_chunk)] or [0]


class _NotReplicated(nn.Module):
    """Stands in, inside a replica, for a child module dp does not copy to the GPUs."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(self.message)

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(self.message)


def _refuse_logging(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError(
        "self.log was called inside forward, which --trainer.strategy=dp runs in one thread per GPU, each on a part"
        " of the batch. Fix: log in training_step / validation_step, on the gathered output of self(x)."
    )


def _not_replicated_message(name: str, child: nn.Module) -> str:
    if isinstance(child, (Metric, MetricCollection)):
        return (
            f"self.{name} (a torchmetrics metric) was used inside forward, which --trainer.strategy=dp runs in one"
            " thread per GPU, each on a part of the batch. Fix: update metrics in training_step / validation_step,"
            " on the gathered output of self(x)."
        )
    return (
        f"self.{name} was used inside forward, but the module's {DP_MODULES} does not list it, so"
        f" --trainer.strategy=dp does not copy it to the GPUs. Fix: add {name!r} to {DP_MODULES}."
    )


def replicated_children(module: nn.Module) -> list[str]:
    """Names of the child modules dp copies to every GPU each step: ``module.dp_modules``, else all but metrics."""
    children = dict(module.named_children())
    declared = module.dp_modules if isinstance(module, ReplicatesForDataParallel) else None
    if declared is None:
        return [name for name, child in children.items() if not isinstance(child, (Metric, MetricCollection))]
    if isinstance(declared, str) or not all(isinstance(name, str) and name in children for name in declared):
        raise ValueError(
            f"{type(module).__name__}.{DP_MODULES} must list names of its child modules (those forward uses), got"
            f" {declared!r}; its children are {sorted(children)}. Fix: e.g. {DP_MODULES} = ('net',)."
        )
    return [name for name in declared if not isinstance(children[name], (Metric, MetricCollection))]


def in_callers_modes(forward: Callable[..., Any], device_type: str) -> Callable[..., Any]:
    # the modes are per thread: torch's parallel_apply re-enters autocast with the default dtype (bf16-mixed would
    # run in fp16) and not inference mode (in-place ops on the input chunks would fail in validation)
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    autocast, dtype = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)

    def run(replica: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with (
            torch.inference_mode(inference),
            torch.set_grad_enabled(grad),
            torch.autocast(device_type, dtype=dtype, enabled=autocast),
        ):
            return forward(replica, *args, **kwargs)

    return run


def gather_outputs(outputs: Sequence[Any], target_device: int | None, sizes: Sequence[int]) -> Any:
    """torch's ``gather``, but a 0-dim tensor is the replicas' mean weighted by chunk size; other values must agree."""
    first = outputs[0]
    if isinstance(first, Tensor):
        if first.dim() > 0:
            return gather(list(outputs), target_device, dim=0)
        if not (first.is_floating_point() or first.is_complex()):
            raise TypeError(
                f"forward returned a 0-dim {first.dtype} tensor, which --trainer.strategy=dp cannot combine over"
                " the GPUs (it averages floating-point scalars, such as a mean loss). Fix: return it with a batch"
                " dimension, or compute it from the gathered output in the step."
            )
        values = gather([output.reshape(1) for output in outputs], target_device, dim=0)
        weights = torch.tensor(sizes, dtype=values.dtype, device=values.device) / sum(sizes)
        return (values * weights).sum()
    if first is None:
        return None
    if isinstance(first, dict):
        if any(output.keys() != first.keys() for output in outputs):
            raise ValueError("forward returned dicts with different keys on different GPUs under dp.")
        return type(first)(
            (key, gather_outputs([output[key] for output in outputs], target_device, sizes)) for key in first
        )
    if isinstance(first, (list, tuple)):
        gathered = [gather_outputs(items, target_device, sizes) for items in zip(*outputs, strict=True)]
        return type(first)._make(gathered) if hasattr(first, "_fields") else type(first)(gathered)
    if all(output is first or output == first for output in outputs):
        return first
    raise TypeError(
        f"forward returned a {type(first).__name__} that differs between the GPUs under --trainer.strategy=dp, which"
        " concatenates tensors only. Fix: return it as a tensor with a batch dimension."
    )


class ParallelForward:
    """``nn.DataParallel.forward`` without wrapping the module: its hooks and state-dict keys stay its own."""

    def __init__(self, module: nn.Module, devices: list[torch.device]) -> None:
        self.module = module
        self.device_ids = [device.index for device in devices]
        self.device_type = devices[0].type
        self.forward = type(module).forward  # unbound: replicas call it on themselves

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sizes = chunk_sizes(args, kwargs, len(self.device_ids))
        if len(sizes) <= 1:  # no tensors, or a batch too small to split: one device, as without dp
            return self.forward(self.module, *args, **kwargs)
        devices = self.device_ids[: len(sizes)]
        inputs, kwargs_per_device = scatter_to_devices(args, kwargs, devices)
        replicas = self.replicas(devices)
        outputs = parallel_apply(replicas, inputs, kwargs_per_device, devices)
        return gather_outputs(outputs, self.device_ids[0], sizes)

    def replicas(self, devices: list[int | None]) -> list[nn.Module]:
        module = self.module
        kept = replicated_children(module)
        # torch's replicate copies every module below the one it gets
        with only_children(module, kept):
            replicas = replicate(module, devices, detach=not torch.is_grad_enabled())
        skipped = {
            name: _NotReplicated(_not_replicated_message(name, child))
            for name, child in module.named_children()
            if name not in kept
        }
        forward = in_callers_modes(self.forward, self.device_type)
        for replica in replicas:
            for name, stand_in in skipped.items():
                setattr(replica, name, stand_in)
            replica.forward = functools.partial(forward, replica)
            replica.log = replica.log_dict = _refuse_logging
        return replicas


class DataParallelStrategy(ParallelStrategy):
    """Single-process data parallelism over the GPUs of one machine; on the CPU, one device, and says so."""

    strategy_name = "dp"

    def __init__(self, parallel_devices: list[torch.device] | None = None, **kwargs: Any) -> None:
        super().__init__(parallel_devices=parallel_devices, **kwargs)
        self.num_nodes = 1

    # rank 0 of a world of one, whatever cluster environment Lightning attaches
    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices, "the Trainer sets parallel_devices before use"
        return self.parallel_devices[0]

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_distributed(self) -> bool:
        return False

    @property
    def distributed_sampler_kwargs(self) -> None:
        return None

    @property
    def parallel_forward_active(self) -> bool:
        devices = self.parallel_devices or []
        return len(devices) > 1 and all(device.type == "cuda" for device in devices)

    def setup_environment(self) -> None:
        if self.num_nodes > 1:
            raise ValueError(
                f"--trainer.strategy=dp runs in one process on one machine, but --trainer.num_nodes={self.num_nodes}."
                " Fix: use --trainer.strategy=ddp for several nodes."
            )
        devices = self.parallel_devices or []
        if devices and devices[0].type != "cuda":
            if len(devices) > 1:
                rank_zero_warn(
                    f"--trainer.strategy=dp with accelerator={devices[0].type} runs as a single device: DataParallel"
                    " splits batches across GPUs only. For several CPU processes use --trainer.strategy=ddp."
                )
            self.parallel_devices = devices[:1]
        super().setup_environment()

    def model_to_device(self) -> None:
        self.model.to(self.root_device)  # type: ignore[union-attr]

    def _setup_model(self, model: nn.Module) -> nn.Module:
        if self.parallel_forward_active:
            model.forward = ParallelForward(model, self.parallel_devices or [])
        return model

    def teardown(self) -> None:
        module = self.lightning_module
        if module is not None and isinstance(vars(module).get("forward"), ParallelForward):
            del module.forward
        super().teardown()

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: ReduceOp | str | None = "mean") -> Any:
        return tensor

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        return tensor

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        pass

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision
