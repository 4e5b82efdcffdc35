"""``strategy="fsdp2"`` and ``strategy="tensor_parallel"``: model parallelism over a device mesh.

Both are Lightning's ``ModelParallelStrategy`` (FSDP2 and tensor parallelism on a 2-D device mesh
``(data_parallel, tensor_parallel)``) registered under a name, as ``dp`` is:

- ``fsdp2`` shards parameters, gradients and optimizer state over every process (``data_parallel`` = world size,
  ``tensor_parallel`` = 1). A model needs no code for it: without a ``configure_model`` hook the default policy
  (``multigpu/strategies/sharding.py``) shards each child module that holds parameters. A large transformer should
  shard per block in its own ``configure_model`` (docs/models.md, "Large models"; the example GPT does it).
- ``tensor_parallel`` splits each layer's matrices within a node (``tensor_parallel`` = processes per node) and
  shards with FSDP2 across nodes (``data_parallel`` = nodes), Lightning's default split. The model says how its
  layers split in ``configure_model`` (a ``parallelize_module`` plan); ``--trainer.strategy.tensor_parallel_size``
  and ``data_parallel_size`` (a ``class_path`` strategy in YAML) choose another split.

Lightning's own ``ModelParallelStrategy`` given as a class (``class_path``) keeps its settings and gets the same
clipping across meshes (``ClipAcrossMeshes``, which the CLI adds).

The batch follows the data-parallel dimension: ranks of one tensor-parallel group see the same samples, and the
global batch (``--data.batch_size``) is split over the data-parallel ranks only (``multigpu/data/base.py``).

Checkpoints are sharded by default (a folder with one file per rank, written by
``torch.distributed.checkpoint``); ``python -m src.consolidate DIR OUT.ckpt`` turns one into a single file.

Precision: ``32-true``, ``bf16-mixed``, ``bf16-true``, ``16-mixed`` (GPU) and ``64-true`` (used by the tests to
prove that the sharded run computes what ddp computes). Lightning checks the precision only for a strategy
given as an object; given by name, these reach the plugins Lightning uses for any strategy, which work on
FSDP2's sharded parameters: ``module.to(dtype)`` converts them, autocast runs the forward, and the gradient
scaler of ``16-mixed`` agrees on overflow across ranks (DTensor reduces its ``found_inf``).
"""

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
from multigpu.compat import collective_timeout, overrides_hook, ranks_join_within, set_mesh_sizes
from multigpu.errors import ConfigurationError
from multigpu.strategies.ddp import START_TIMEOUT, export_launch_variables, put_back_launch_variables
from multigpu.strategies.sharding import DefaultShardingPolicy

if TYPE_CHECKING:
    import lightning.pytorch as pl

#: how long a collective waits unless told: the default of Lightning's own ``ModelParallelStrategy``
LIGHTNING_TIMEOUT: timedelta | None = inspect.signature(ModelParallelStrategy).parameters["timeout"].default


def clip_grad_norm(
    parameters: Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    reduce_group: Any = None,
    not_in_norm: Collection[int] = (),
) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for gradients that live on different device meshes.

    Under tensor parallelism, the split layers' gradients are DTensors on the 2-D mesh and the others (norms,
    embeddings) on the data-parallel mesh only; torch's function stacks their norms and refuses two meshes. The
    norm of each mesh's group is made whole (``full_tensor``), then the norm of those norms is the total. Under
    ``pipeline`` each stage holds other parameters: ``reduce_group`` (the stages) sums their ``norm_type``-th
    powers, and ``not_in_norm`` (ids) leaves out a tied weight's second copy, which one device counts once.
    """
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
    if reduce_group is not None:  # a finite norm_type: the stages' powers add up (no inf-norm across stages)
        power = total.double() ** norm_type
        torch.distributed.all_reduce(power, group=reduce_group)
        total = (power ** (1.0 / norm_type)).to(total.dtype)
    for params in groups.values():  # one mesh per call: torch's foreach kernels refuse to mix them
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def clip_across_meshes(plugin: Precision) -> None:
    """Make a precision plugin clip gradient norms with ``clip_grad_norm`` above: it clips (after unscaling, under
    ``16-mixed``) with torch's single-mesh function, which fails under tensor parallelism."""

    def clip_grad_by_norm(optimizer: Any, clip_val: float) -> None:
        clip_grad_norm(list(plugin.main_params(optimizer)), clip_val)

    plugin.clip_grad_by_norm = clip_grad_by_norm  # this plugin only: its clip_gradients calls self.clip_grad_by_norm


class ClipAcrossMeshes(Callback):
    """The clipping of ``fsdp2`` / ``tensor_parallel`` for a ``ModelParallelStrategy`` of another class (Lightning's
    own, given as a ``class_path``), which clips with torch's function; the template's classes install it themselves.
    Installed at ``setup``, in every process, before the first optimizer step."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        clip_across_meshes(trainer.precision_plugin)


class _ModelParallelMixin:
    """What the two strategies share: the ranks' start bounded apart from the collectives, gradient clipping across
    device meshes, atomic sharded checkpoints read without running code."""

    sharded_checkpoints: bool
    #: torchrun's variables as they were before ``setup_environment`` set them, put back at ``teardown``
    launch_variables_before: dict[str, str | None] = {}

    def setup_environment(self) -> None:
        """Create the process group, waiting up to ``START_TIMEOUT`` for the ranks to join, and tell the process its
        place by torchrun's variables (``ddp.py``)."""
        with ranks_join_within(self, START_TIMEOUT):
            super().setup_environment()  # type: ignore[misc]
        self.launch_variables_before = export_launch_variables(self)  # type: ignore[arg-type]

    def teardown(self) -> None:
        super().teardown()  # type: ignore[misc]
        put_back_launch_variables(self.launch_variables_before)
        self.launch_variables_before = {}

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Write the shards into a staging folder, then move it over the old checkpoint
        (``multigpu/checkpoints/sharded.py``): a kill mid-write leaves the previous checkpoint whole. With
        ``--checkpoint.async_save`` (a ``BackgroundCheckpointIO``) the shards are copied into host memory here and
        written, then moved, on the writer thread (``multigpu/checkpoints/background.py``)."""
        if not self.sharded_checkpoints or "://" in str(filepath) or storage_options is not None:
            super().save_checkpoint(checkpoint, filepath, storage_options)  # type: ignore[misc]
            return  # (Lightning refuses storage_options here)
        final = Path(self.broadcast(str(filepath)))  # type: ignore[attr-defined]
        staging = staging_path(final)
        io = self.checkpoint_io  # type: ignore[attr-defined]
        background = io if isinstance(io, BackgroundCheckpointIO) else None
        if background is not None:
            background.wait()  # the previous save is in place before its staging folder can be cleared
        rank_zero = self.global_rank == 0  # type: ignore[attr-defined]
        if rank_zero:
            shutil.rmtree(staging, ignore_errors=True)  # a write a kill interrupted
        self.barrier()  # type: ignore[attr-defined]
        # the layout of ModelParallelStrategy.save_checkpoint: the shards by torch.distributed.checkpoint, the rest
        # (loops, callbacks, random states) in meta.pt by rank 0, written now (it is small)
        shards = {"state_dict": checkpoint.pop("state_dict")}
        shards.update({f"optimizer_{i}": state for i, state in enumerate(checkpoint.pop("optimizer_states", []))})
        if rank_zero:
            atomic_torch_save(checkpoint, staging / METADATA_FILE)
        if background is not None:
            then = (lambda: move_into_place(staging, final)) if rank_zero else None
            background.save_shards(shards, staging, final, then=then, timeout=collective_timeout(self))
            return
        write_shards(shards, staging, final)  # returns on every rank once every rank's shards and the index are written
        if rank_zero:
            move_into_place(staging, final)
        self.barrier()  # type: ignore[attr-defined]

    @property
    def offloads_state(self) -> bool:
        """Whether the state a save collects is copied into host memory first (Lightning's ``cpu_offload``): not for
        shards written in the background, whose host copy (page-locked, reused) the writer makes; Lightning's would
        copy a GPU's state synchronously into new memory before it."""
        return not (self.sharded_checkpoints and isinstance(self.checkpoint_io, BackgroundCheckpointIO))  # type: ignore[attr-defined]

    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self.offloads_state:
            return super().lightning_module_state_dict()  # type: ignore[misc]
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(cpu_offload=False))  # type: ignore[attr-defined]

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        if self.offloads_state:
            return super().optimizer_state(optimizer)  # type: ignore[misc]
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optimizer = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer's
        return get_optimizer_state_dict(self.model, optimizer, options=StateDictOptions(cpu_offload=False))  # type: ignore[attr-defined]

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's resume, reading only what ``multigpu/checkpoints/safe.py`` checked: a folder's index through a
        reader given the checked copy (torch's own reader unpickles the file with ``pickle.load``), its entries
        that are no tensor and ``meta.pt`` with ``weights_only``; a single file with ``weights_only`` too."""
        path = Path(self.broadcast(str(checkpoint_path)))  # type: ignore[attr-defined]
        if not path.is_dir():
            weights_only = True if weights_only is None else weights_only
            return super().load_checkpoint(path, weights_only=weights_only)  # type: ignore[misc]
        checked = check_sharded_checkpoint(path, map_location=None)  # meta.pt's tensors where saved, as Lightning
        model, optimizers = self.model, self.optimizers  # type: ignore[attr-defined]
        load_shards(path, checked, model, optimizers, self.lightning_module.strict_loading)  # type: ignore[attr-defined]
        return checked.meta

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)  # type: ignore[misc]
        clip_across_meshes(self.precision_plugin)  # type: ignore[attr-defined]


class FSDP2Strategy(_ModelParallelMixin, ModelParallelStrategy):
    """FSDP2 over all processes: every rank holds ``1 / world size`` of the parameters, gradients and optimizer state.

    Args:
        save_distributed_checkpoint: Save a folder of shards (one file per rank), the default; ``False`` gathers a
            single file on rank 0, which needs the whole model and optimizer state in its host memory.
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
        # every process is one data-parallel rank; the base class would put the processes of a node on the
        # tensor-parallel dimension
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
        tensor_parallel_size: Ranks that split each layer (``"auto"``: the processes per node). The two multiply
            to the world size.
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
            # before any process group exists: the base class would raise a TypeError from every rank, later
            raise ConfigurationError(
                f"--trainer.strategy=tensor_parallel needs the model to say how its layers split:"
                f" {type(module).__name__} has no configure_model hook. Fix: add a configure_model that applies a"
                " tensor-parallel plan (parallelize_module; the engine's docs/strategies.md, tensor_parallel), or use"
                " --trainer.strategy=fsdp2, which shards any model without code.",
                every_rank=True,
            )
        super().setup_environment()


def prediction_replica(trainer: pl.Trainer) -> int | None:
    """The data-parallel replica whose outputs this process writes, or None where another process of the same
    replica writes them: for a prediction writer (Lightning's ``BasePredictionWriter``), which Lightning calls in
    every process. Under ``ddp`` every process is its own replica (its global rank); under ``tensor_parallel`` and
    ``pipeline`` the processes of one replica see the same samples and compute the same outputs, so one of them
    writes (tensor-parallel rank 0, the last pipeline stage's rank).

    Example::

        replica = prediction_replica(trainer)
        if replica is not None:
            torch.save(predictions, f"predictions_{replica}.pt")
    """
    strategy = trainer.strategy
    mesh = strategy.device_mesh if isinstance(strategy, ModelParallelStrategy) else None
    if mesh is not None:
        names = mesh.mesh_dim_names or ()
        if "tensor_parallel" in names and mesh["tensor_parallel"].get_local_rank() != 0:
            return None
        if "pipeline" in names and mesh["pipeline"].get_local_rank() != mesh["pipeline"].size() - 1:
            return None
    sampler = getattr(strategy, "distributed_sampler_kwargs", None) or {}  # the rank among data-parallel replicas
    return int(sampler.get("rank", trainer.global_rank))


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def memory_per_rank(module: torch.nn.Module, optimizers: Iterable[torch.optim.Optimizer] = ()) -> dict[str, int]:
    """Bytes this rank holds of the parameters, their gradients and the optimizer state, under any strategy.

    Under ``fsdp2`` / ``tensor_parallel`` a parameter is a DTensor and only its local shard counts. Gradients are
    counted for every trainable parameter (their size once the first backward allocated them); the optimizer
    state counts what exists (Adam allocates its moments at the first step, so it is 0 before). FSDP2 units a
    forward left gathered (the root keeps its parameters after an evaluation forward) are resharded first, so
    the figures are what the rank holds between steps; the next forward gathers them again.
    """
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()
    params = {id(p): p for p in module.parameters()}.values()  # a tied weight once

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
