"""``strategy="fsdp2"`` and ``strategy="tensor_parallel"``: Lightning's ``ModelParallelStrategy`` under a name, with
atomic sharded checkpoints and gradient clipping across device meshes (docs/strategies.md)."""

from __future__ import annotations

import inspect
import shutil
from collections.abc import Collection, Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins import Precision
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from multigpu.checkpoints.background import BackgroundCheckpointIO
from multigpu.checkpoints.files import atomic_torch_save
from multigpu.checkpoints.safe import METADATA_FILE
from multigpu.checkpoints.sharded import (
    check_sharded_checkpoint,
    load_shards,
    move_into_place,
    staging_path,
    write_shards,
)
from multigpu.compat import collective_timeout, overrides_hook, set_mesh_sizes
from multigpu.errors import ConfigurationError
from multigpu.strategies.ddp import PlacedRanks
from multigpu.strategies.sharding import DefaultShardingPolicy

if TYPE_CHECKING:
    import lightning.pytorch as pl

LIGHTNING_TIMEOUT: timedelta | None = inspect.signature(ModelParallelStrategy).parameters["timeout"].default


def clip_grad_norm(
    parameters: Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    reduce_group: Any = None,
    not_in_norm: Collection[int] = (),
) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for gradients on several device meshes (torch's refuses to mix them);
    ``reduce_group`` sums the pipeline stages' norms, ``not_in_norm`` (ids) leaves out a tied weight's second copy."""
    groups: dict[Any, list[Tensor]] = {}
    for param in parameters:
        if param.grad is not None:
            groups.setdefault(param.grad.device_mesh if isinstance(param.grad, DTensor) else None, []).append(param)
    norms = []
    for params in groups.values():
        counted = [p.grad for p in params if id(p) not in not_in_norm]
        norm = torch.nn.utils.get_total_norm(counted, norm_type) if counted else torch.zeros(())
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.nn.utils.get_total_norm(norms, norm_type) if norms else torch.zeros(())
    if reduce_group is not None:  # a finite norm_type: the stages' powers add up
        power = total.double() ** norm_type
        torch.distributed.all_reduce(power, group=reduce_group)
        total = (power ** (1.0 / norm_type)).to(total.dtype)
    for params in groups.values():  # one mesh per call: torch's foreach kernels refuse to mix them
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def clip_across_meshes(plugin: Precision) -> None:
    """Make a precision plugin clip with ``clip_grad_norm``: torch's function fails under tensor parallelism."""

    def clip_grad_by_norm(optimizer: Any, clip_val: float) -> None:
        clip_grad_norm(list(plugin.main_params(optimizer)), clip_val)

    plugin.clip_grad_by_norm = clip_grad_by_norm


class ClipAcrossMeshes(Callback):
    """The clipping of ``fsdp2`` for Lightning's own ``ModelParallelStrategy`` given as a ``class_path``."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        clip_across_meshes(trainer.precision_plugin)


# typed as the strategy it is mixed into; a plain mixin at run time
_Strategy = ModelParallelStrategy if TYPE_CHECKING else object


class _ModelParallelMixin(PlacedRanks, _Strategy):
    sharded_checkpoints: bool

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        if not self.sharded_checkpoints or "://" in str(filepath) or storage_options is not None:
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        final = Path(self.broadcast(str(filepath)))
        staging = staging_path(final)
        io = self.checkpoint_io
        background = io if isinstance(io, BackgroundCheckpointIO) else None
        if background is not None:
            background.wait()  # the previous save is in place before its staging folder can be cleared
        rank_zero = self.global_rank == 0
        if rank_zero:
            shutil.rmtree(staging, ignore_errors=True)  # a write a kill interrupted
        self.barrier()
        # ModelParallelStrategy's layout, so that Lightning reads it back
        shards = {"state_dict": checkpoint.pop("state_dict")}
        shards.update({f"optimizer_{i}": state for i, state in enumerate(checkpoint.pop("optimizer_states", []))})
        if rank_zero:
            atomic_torch_save(checkpoint, staging / METADATA_FILE)
        if background is not None:
            then = (lambda: move_into_place(staging, final)) if rank_zero else None
            background.save_shards(shards, staging, final, then=then, timeout=collective_timeout(self))
            return
        write_shards(shards, staging, final)
        if rank_zero:
            move_into_place(staging, final)
        self.barrier()

    @property
    def offloads_state(self) -> bool:
        # the background writer makes its own reused, pinned host copy; Lightning's would be a second, synchronous one
        return not (self.sharded_checkpoints and isinstance(self.checkpoint_io, BackgroundCheckpointIO))

    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self.offloads_state:
            return super().lightning_module_state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(cpu_offload=False))

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        if self.offloads_state:
            return super().optimizer_state(optimizer)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optimizer = getattr(optimizer, "optimizer", optimizer)
        return get_optimizer_state_dict(self.model, optimizer, options=StateDictOptions(cpu_offload=False))

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        # torch's own reader unpickles a folder's index with pickle.load: read only what safe.py checked
        path = Path(self.broadcast(str(checkpoint_path)))
        if not path.is_dir():
            weights_only = True if weights_only is None else weights_only
            return super().load_checkpoint(path, weights_only=weights_only)
        checked = check_sharded_checkpoint(path, map_location=None)
        model, optimizers = self.model, self.optimizers
        load_shards(path, checked, model, optimizers, self.lightning_module.strict_loading)
        return checked.meta

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        clip_across_meshes(self.precision_plugin)


class FSDP2Strategy(_ModelParallelMixin, ModelParallelStrategy):
    """FSDP2 over all processes: every rank holds ``1 / world size`` of the parameters, gradients and optimizer state.

    Args:
        save_distributed_checkpoint: Save a folder of shards (one file per rank); ``False``: one file from rank 0.
        process_group_backend: ``nccl`` on GPUs, ``gloo`` on the CPU unless given.
        timeout: How long a collective waits for the other ranks.
    """

    strategy_name = "fsdp2"

    def __init__(
        self,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = LIGHTNING_TIMEOUT,
    ) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.sharded_checkpoints = save_distributed_checkpoint
        self._default_policy: DefaultShardingPolicy | None = None

    def setup_environment(self) -> None:
        # the base class would put a node's processes on the tensor-parallel dimension
        set_mesh_sizes(self, data_parallel=self.num_nodes * self.num_processes, tensor_parallel=1)
        super().setup_environment()
        module = self.lightning_module
        if module is not None and not overrides_hook(module, "configure_model"):
            self._default_policy = DefaultShardingPolicy.install(module)

    def teardown(self) -> None:
        if self._default_policy is not None:
            self._default_policy.uninstall()
            self._default_policy = None
        super().teardown()


class TensorParallelStrategy(_ModelParallelMixin, ModelParallelStrategy):
    """Tensor parallelism within a node and FSDP2 across nodes (Lightning's ``ModelParallelStrategy`` defaults).

    Args:
        data_parallel_size: Ranks that see different samples (``"auto"``: the number of nodes).
        tensor_parallel_size: Ranks that split each layer (``"auto"``: the processes per node).
        save_distributed_checkpoint: Save a folder of shards (one file per rank), the default.
        process_group_backend: ``nccl`` on GPUs, ``gloo`` on the CPU unless given.
        timeout: How long a collective waits for the other ranks.
    """

    strategy_name = "tensor_parallel"

    def __init__(
        self,
        data_parallel_size: Literal["auto"] | int = "auto",
        tensor_parallel_size: Literal["auto"] | int = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = LIGHTNING_TIMEOUT,
    ) -> None:
        super().__init__(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.sharded_checkpoints = save_distributed_checkpoint

    def setup_environment(self) -> None:
        module = self.lightning_module
        if module is not None and not overrides_hook(module, "configure_model"):
            # now, before any process group: the base class would raise a TypeError from every rank
            raise ConfigurationError(
                f"--trainer.strategy=tensor_parallel needs the model to say how its layers split:"
                f" {type(module).__name__} has no configure_model hook. Fix: add a configure_model that applies a"
                " tensor-parallel plan (parallelize_module; the engine's docs/strategies.md, tensor_parallel), or use"
                " --trainer.strategy=fsdp2, which shards any model without code.",
                every_rank=True,
            )
        super().setup_environment()


def prediction_replica(trainer: pl.Trainer) -> int | None:
    """The data-parallel replica whose predictions this process writes, or None where another process writes them."""
    strategy = trainer.strategy
    mesh = strategy.device_mesh if isinstance(strategy, ModelParallelStrategy) else None
    if mesh is not None:
        names = mesh.mesh_dim_names or ()
        if "tensor_parallel" in names and mesh["tensor_parallel"].get_local_rank() != 0:
            return None
        if "pipeline" in names and mesh["pipeline"].get_local_rank() != mesh["pipeline"].size() - 1:
            return None
    sampler = getattr(strategy, "distributed_sampler_kwargs", None) or {}
    return int(sampler.get("rank", trainer.global_rank))


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def memory_per_rank(module: torch.nn.Module, optimizers: Iterable[torch.optim.Optimizer] = ()) -> dict[str, int]:
    """Bytes this rank holds of the parameters, their gradients and the optimizer state, under any strategy."""
    # an FSDP2 root keeps its parameters gathered after an evaluation forward: count what a rank holds between steps
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()
    params = {id(p): p for p in module.parameters()}.values()

    def size(tensor: Tensor) -> int:
        local = _local(tensor)
        return local.numel() * local.element_size()

    optimizer_bytes = sum(
        size(value)
        for optimizer in optimizers
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, Tensor) and value.dim() > 0  # not Adam's 0-dim step counter
    )
    return {
        "parameters": sum(size(p) for p in params),
        "gradients": sum(size(p) for p in params if p.requires_grad),
        "optimizer_state": optimizer_bytes,
    }
