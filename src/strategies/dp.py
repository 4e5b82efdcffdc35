"""``strategy="dp"`` for Lightning 2.x: one process, the batch of every forward split across the GPUs.

Lightning 2.x removed its DataParallel strategy. Its 1.x version ran ``training_step`` inside every replica
thread, which needed ``*_step_end`` hooks (gone in 2.x) and made ``self.log`` and torchmetrics racy. This one
follows Lightning Fabric's DataParallel instead: the steps run once, in the main process, and only the module's
``forward`` is parallel. When ``training_step`` calls ``self(x)``, the batch is scattered over the devices,
the module is replicated, the replicas run in threads and the outputs are gathered on the first device, where
the loss, ``self.log`` and metrics see the whole batch, exactly as on one device. Autograd carries the gradients
back through the gather and the replicas and sums them on the first device, so the backpropagated loss and the
gradients are those of single-device training on the same batch. The module itself is never wrapped, so
checkpoints have the same keys as single-device ones.

Usage: ``python -m src.cli fit --trainer.strategy=dp --trainer.accelerator=gpu --trainer.devices=4``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.strategies import ParallelStrategy, StrategyRegistry
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torch.nn.parallel import gather, parallel_apply, replicate
from torch.nn.parallel.scatter_gather import scatter_kwargs


def _replica_forward(
    replica: nn.Module, forward: Callable[..., Any], autocast: tuple[bool, torch.dtype], *args: Any, **kwargs: Any
) -> Any:
    # Autocast state is per thread. torch's parallel_apply re-enters autocast in each replica thread with the
    # default dtype (float16), which would silently turn bf16-mixed into fp16: restore the caller's dtype.
    enabled, dtype = autocast
    with torch.autocast("cuda", dtype=dtype, enabled=enabled):
        return forward(replica, *args, **kwargs)


class ParallelForward:
    """Stands in for ``module.forward``: scatter the inputs, replicate, run the replicas in parallel, gather.

    This is what ``nn.DataParallel.forward`` does, without wrapping the module, so that Lightning keeps calling
    the module's own hooks and state-dict keys stay unprefixed.
    """

    def __init__(self, module: nn.Module, devices: list[torch.device]) -> None:
        self.module = module
        self.device_ids = [device.index for device in devices]
        self.forward = type(module).forward  # the class's forward, unbound: replicas call it on themselves

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs, kwargs_per_device = scatter_kwargs(args, kwargs, self.device_ids, dim=0)
        if not inputs:  # a call without tensors runs once, on the first device
            inputs, kwargs_per_device = ((),), ({},)
        if len(inputs) == 1:
            return self.forward(self.module, *inputs[0], **kwargs_per_device[0])
        devices = self.device_ids[: len(inputs)]
        replicas = replicate(self.module, devices, detach=not torch.is_grad_enabled())
        autocast = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
        for replica in replicas:
            # each replica is a shallow copy of the module, this object included: point it at the real forward
            replica.forward = functools.partial(_replica_forward, replica, self.forward, autocast)
        outputs = parallel_apply(replicas, inputs, kwargs_per_device, devices)
        return gather(outputs, self.device_ids[0], dim=0)


class DataParallelStrategy(ParallelStrategy):
    """Single-process data parallelism over the GPUs of one machine (see the module docstring).

    ``--data.batch_size`` is the batch of one step on all GPUs together, as on one device; each GPU computes
    ``batch_size / devices`` samples of every forward. With ``accelerator=cpu`` (no GPUs to split over) it runs
    as a single device, and says so.
    """

    strategy_name = "dp"

    def __init__(self, parallel_devices: list[torch.device] | None = None, **kwargs: Any) -> None:
        super().__init__(parallel_devices=parallel_devices, **kwargs)
        self.num_nodes = 1

    # One process: rank 0 of a world of one, whatever cluster environment Lightning attaches.
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
        return None  # one process reads every sample

    @property
    def parallel_forward_active(self) -> bool:
        """Whether forwards are split across devices (more than one GPU)."""
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
        assert self.model is not None
        self.model.to(self.root_device)

    def _setup_model(self, model: nn.Module) -> nn.Module:
        if self.parallel_forward_active:
            model.forward = ParallelForward(model, self.parallel_devices or [])
        return model

    def teardown(self) -> None:
        module = self.lightning_module
        if module is not None and isinstance(module.__dict__.get("forward"), ParallelForward):
            del module.forward
        super().teardown()

    # Collectives are trivial in one process.
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

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="DataParallel: one process, each forward split across the GPUs"
        )


def register_dp_strategy() -> None:
    """Make ``strategy="dp"`` resolve to ``DataParallelStrategy`` (idempotent)."""
    if DataParallelStrategy.strategy_name not in StrategyRegistry:
        DataParallelStrategy.register_strategies(StrategyRegistry)
