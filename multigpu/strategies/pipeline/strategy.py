"""``strategy="pipeline"``: the model's layers cut into stages over processes, each batch split into micro-batches
that flow through them under ``torch.distributed.pipelining``'s schedules, each stage sharded with FSDP2 over the
data-parallel ranks (docs/strategies.md, "Pipeline parallelism")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule

from multigpu.compat import set_device_mesh, set_mesh_sizes
from multigpu.errors import ConfigurationError
from multigpu.hooks.readers import missing_pipeline_hooks, stage_layer_count
from multigpu.strategies.model_parallel import LIGHTNING_TIMEOUT, _ModelParallelMixin, clip_grad_norm
from multigpu.strategies.pipeline.exchange import forward_through_stages, sum_tied_gradients
from multigpu.strategies.pipeline.options import MULTI_STAGE, SCHEDULES, PipelineOptions, pipeline_refusal, split_plan
from multigpu.strategies.pipeline.stages import remove_other_stages, shard_stages, tied_parameter_names

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch.distributed.pipelining import PipelineStage

CHECKPOINT_KEY = "pipeline"


class PipelineStrategy(_ModelParallelMixin, ModelParallelStrategy):
    """Pipeline stages over processes, each stage sharded with FSDP2 (and split with tensor parallelism).

    Args:
        pipeline_size: Processes of one pipeline (``"auto"``: the world size over the other two sizes).
        save_distributed_checkpoint: Save a folder of shards (one file per rank), the default.
        process_group_backend: ``nccl`` on GPUs, ``gloo`` on the CPU unless given.
        timeout: How long a collective waits for the other ranks.
        options: The settings of ``PipelineOptions`` by name (``--pipeline.*`` for the strategy given by name).
    """

    strategy_name = "pipeline"

    def __init__(
        self,
        pipeline_size: Literal["auto"] | int = "auto",
        *,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = LIGHTNING_TIMEOUT,
        **options: Any,
    ) -> None:
        self.options = PipelineOptions(**options)
        schedule = self.options.schedule
        if schedule not in SCHEDULES:
            names = ", ".join(SCHEDULES)
            raise ConfigurationError(
                f"schedule={schedule} is not a pipeline schedule. Fix: one of {names}.", every_rank=True
            )
        super().__init__(
            data_parallel_size=self.options.data_parallel_size,
            tensor_parallel_size=self.options.tensor_parallel_size,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.sharded_checkpoints = save_distributed_checkpoint
        self.pipeline_size = pipeline_size
        self.stage_modules: dict[int, nn.Module] = {}
        self.pipeline_rank = 0
        self._schedule: Any = None
        self.pipeline_stages: list[PipelineStage] = []
        self._batch_shape: torch.Size | None = None
        self._pending: list[tuple[nn.Parameter, Tensor | None]] = []

    @property
    def ranks(self) -> int:
        if self.pipeline_size != "auto":
            return int(self.pipeline_size)
        parallel = self.options.data_parallel_size * self.options.tensor_parallel_size
        return max(1, self.num_nodes * self.num_processes // parallel)

    @property
    def stages_per_rank(self) -> int:
        return self.options.stages_per_rank

    @property
    def stage_count(self) -> int:
        return self.ranks * self.stages_per_rank

    @property
    def pipeline_group(self) -> dist.ProcessGroup:
        return self.device_mesh["pipeline"].get_group()

    @property
    def is_first(self) -> bool:
        return self.pipeline_rank == 0

    @property
    def is_last(self) -> bool:
        return self.pipeline_rank == self.ranks - 1

    def setup_environment(self) -> None:
        module = self.lightning_module
        missing = missing_pipeline_hooks(module) if module is not None else []
        if missing:  # before any process group: every rank would raise later
            raise pipeline_refusal(type(module).__name__, missing)
        world = self.num_nodes * self.num_processes
        data_parallel, tensor_parallel = self.options.data_parallel_size, self.options.tensor_parallel_size
        if self.ranks * data_parallel * tensor_parallel != world:
            raise ConfigurationError(
                f"--trainer.strategy.pipeline_size={self.ranks} x data_parallel_size={data_parallel} x"
                f" tensor_parallel_size={tensor_parallel} must be the number of processes ({world}). Fix: set"
                " --trainer.devices and --trainer.num_nodes to their product, or change the sizes.",
                every_rank=True,
            )
        # Lightning's 2-D mesh first (its checks, its process group), then the 3-D mesh the model's hook uses
        set_mesh_sizes(self, data_parallel=self.ranks * data_parallel, tensor_parallel=tensor_parallel)
        super().setup_environment()
        mesh = init_device_mesh(
            self.root_device.type,
            (self.ranks, data_parallel, tensor_parallel),
            mesh_dim_names=("pipeline", "data_parallel", "tensor_parallel"),
        )
        set_device_mesh(self, mesh)
        self.pipeline_rank = mesh["pipeline"].get_local_rank()
        assert module is not None
        if self.stage_modules:
            return  # built for an earlier run of this Trainer: the model holds only those stages' layers
        self.parameter_order = [name for name, _ in module.named_parameters()]
        self.tied = tied_parameter_names(module)
        indices = range(self.pipeline_rank, self.stage_count, self.ranks)
        self.stage_modules = {index: module.pipeline_stage(index, self.stage_count) for index in indices}
        remove_other_stages(module, list(self.stage_modules.values()))

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        data_parallel = self.device_mesh["data_parallel"]  # the stages of one pipeline see the same samples
        return {"num_replicas": data_parallel.size(), "rank": data_parallel.get_local_rank()}

    def setup(self, trainer: pl.Trainer) -> None:
        shard_stages(self.stage_modules, self.device_mesh["data_parallel"], type(self.lightning_module).__name__)
        super().setup(trainer)
        self.precision_plugin.clip_grad_by_norm = self._clip_grad_by_norm
        self._tied_held = self._held_tied()
        held = [
            (index, stage_layer_count(stage), sum(p.numel() for p in stage.parameters()))
            for index, stage in self.stage_modules.items()
        ]
        gathered: list[Any] = [None] * self.ranks
        dist.all_gather_object(gathered, held, group=self.pipeline_group)
        stages = sorted(stage for of_rank in gathered for stage in of_rank)
        self.stage_sizes = [(layers, parameters) for _, layers, parameters in stages]

    def pipeline_plan(self) -> dict[str, Any]:
        return split_plan(self.options, self.ranks, self.stage_sizes)

    def teardown(self) -> None:
        vars(self.precision_plugin).pop("clip_grad_by_norm", None)
        self._schedule = None
        self.pipeline_stages = []
        super().teardown()

    def _schedule_for(self, batch_size: int) -> Any:
        # built at the first batch: PipelineStage needs static shapes
        if self._schedule is None:
            micro_batches = self.options.micro_batches
            if batch_size % micro_batches:
                raise ConfigurationError(
                    f"a batch of {batch_size} samples per data-parallel rank does not split into"
                    f" --trainer.strategy.micro_batches={micro_batches} equal micro-batches. Fix: make"
                    " --data.batch_size / data_parallel_size a multiple of micro_batches.",
                    every_rank=True,
                )
            from torch.distributed import pipelining  # every run imports this module (the registry); few use it

            stages = [
                pipelining.PipelineStage(stage, index, self.stage_count, self.root_device, group=self.pipeline_group)
                for index, stage in self.stage_modules.items()
            ]
            held = stages if self.options.schedule in MULTI_STAGE else stages[0]
            self._schedule = getattr(pipelining, SCHEDULES[self.options.schedule])(
                held, micro_batches, loss_fn=self._micro_batch_loss, scale_grads=False
            )
            self.pipeline_stages = stages
        return self._schedule

    def _micro_batch_loss(self, output: Tensor, target: Tensor) -> Tensor:
        # the backward of each micro-batch's share adds up to one device's backward of the accumulated batch mean
        trainer = self.lightning_module.trainer
        scale = self.options.micro_batches * trainer.accumulate_grad_batches
        return self.lightning_module.pipeline_loss(output, target) / scale

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        batch = args[0]
        inputs, targets = batch
        if self._batch_shape is None:
            self._batch_shape = inputs.shape
        elif inputs.shape != self._batch_shape:
            raise ConfigurationError(
                f"a training batch of shape {tuple(inputs.shape)} after batches of {tuple(self._batch_shape)}: the"
                " pipeline's stages exchange activations of one fixed shape. Fix: drop the last, shorter batch of"
                " an epoch (the template's data modules do: drop_last) or size the data set to whole batches."
            )
        schedule = self._schedule_for(len(inputs))
        # Lightning zeroes the gradients between training_step and backward: the schedule's are added in backward()
        trained = [p for p in self.lightning_module.parameters() if p.requires_grad]
        earlier = [p.grad for p in trained]
        for parameter in trained:
            parameter.grad = None
        losses: list[Tensor] = []
        with self.precision_plugin.train_step_context():
            if self.is_first:
                schedule.step(inputs, target=targets if self.is_last else None, losses=losses)
            elif self.is_last:
                schedule.step(target=targets, losses=losses)
            else:
                schedule.step()
        self._pending = [(p, p.grad) for p in trained]
        for parameter, grad in zip(trained, earlier, strict=True):
            parameter.grad = grad
        loss = torch.zeros((), dtype=torch.float64, device=self.root_device)
        if self.is_last:
            loss += torch.stack([value.detach().double() for value in losses]).sum()
            loss *= self.lightning_module.trainer.accumulate_grad_batches
        dist.broadcast(loss, group=self.pipeline_group, group_src=self.ranks - 1)
        loss = loss.to(self._loss_dtype())
        with answered(self.lightning_module, "model_step", loss):
            return self.lightning_module.training_step(*args, **kwargs)

    def backward(self, closure_loss: Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> Tensor:
        pending, self._pending = self._pending, []
        sum_tied_gradients(self._tied_held, dict(pending), self.pipeline_group, self.ranks, self.root_device)
        for parameter, grad in pending:
            if grad is not None:
                parameter.grad = grad if parameter.grad is None else parameter.grad + grad
        return closure_loss

    def _loss_dtype(self) -> torch.dtype:
        dtype = next((p.dtype for p in self.lightning_module.parameters()), torch.float32)
        return dtype if dtype in (torch.float32, torch.float64) else torch.float32

    def _held_tied(self) -> list[nn.Parameter | None]:
        named = dict(self.lightning_module.named_parameters())
        end = (lambda first, last: first) if self.is_first else (lambda first, last: last) if self.is_last else None
        return [named.get(end(first, last)) if end is not None else None for first, last in self.tied]

    def _clip_grad_by_norm(self, optimizer: Any, clip_val: float) -> None:
        counted_elsewhere = {id(p) for p in self._tied_held if p is not None} if not self.is_first else set()
        clip_grad_norm(
            list(self.precision_plugin.main_params(optimizer)),
            clip_val,
            reduce_group=self.pipeline_group,
            not_in_norm=counted_elsewhere,
        )

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.val_step_context(), self._forward_through_stages():
            return self.lightning_module.validation_step(*args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.test_step_context(), self._forward_through_stages():
            return self.lightning_module.test_step(*args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.predict_step_context(), self._forward_through_stages():
            return self.lightning_module.predict_step(*args, **kwargs)

    @contextlib.contextmanager
    def _forward_through_stages(self) -> Iterator[None]:
        self.lightning_module.forward = self.forward_through_stages
        try:
            yield
        finally:
            vars(self.lightning_module).pop("forward", None)
            # an FSDP2 root keeps its parameters gathered for a backward; left so, the next training step's
            # gradients of the stage's own parameters (embeddings, head) would not reach them
            for stage in self.stage_modules.values():
                if isinstance(stage, FSDPModule):
                    stage.reshard()

    def forward_through_stages(self, inputs: Tensor) -> Tensor:
        """The model's forward through every stage (any batch size), its output on every process of the pipeline."""
        stages, group, rank = self.stage_modules, self.pipeline_group, self.pipeline_rank
        return forward_through_stages(stages, inputs, group, rank, self.ranks, self.stage_count, self.root_device)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "stages": self.stage_count,
            "stages_per_rank": self.stages_per_rank,
            "parameter_order": self.parameter_order,
        }
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        # keyed by parameter name (state.NAME.exp_avg): the stages' keys are disjoint, as shards need
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(
            full_state_dict=not self.sharded_checkpoints,
            cpu_offload=self.offloads_state,
            flatten_optimizer_state_dict=True,
        )
        optimizer = getattr(optimizer, "optimizer", optimizer)
        return get_optimizer_state_dict(self.model, optimizer, options=options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        from multigpu.checkpoints.sharded import check_sharded_checkpoint, load_shards

        path = Path(self.broadcast(str(checkpoint_path)))
        if not path.is_dir():
            raise ConfigurationError(
                f"--ckpt_path={path} is not a sharded pipeline checkpoint: a pipeline run resumes from the folder a"
                " pipeline run saved. Fix: pass that folder (e.g. runs/NAME/checkpoints/last.ckpt); to evaluate"
                " a single-file checkpoint, run validate/test/predict with another strategy.",
                every_rank=True,
            )
        checked = check_sharded_checkpoint(path, map_location=None)
        split = checked.meta.get(CHECKPOINT_KEY) or {}
        saved, saved_per_rank = split.get("stages"), split.get("stages_per_rank", 1)
        if (saved, saved_per_rank) != (self.stage_count, self.stages_per_rank):
            again = (
                f"resume with {saved // saved_per_rank} processes per pipeline (--trainer.devices x"
                " --trainer.num_nodes over --pipeline.data_parallel_size x tensor_parallel_size) and"
                f" --pipeline.stages_per_rank={saved_per_rank}"
                if saved
                else "resume it under the strategy that saved it"
            )
            raise ConfigurationError(
                f"--ckpt_path={path} was saved by a run with {saved or 'no'} pipeline stages ({saved_per_rank} per"
                f" rank); this run has {self.stage_count} ({self.stages_per_rank} per rank). Fix: {again}, or"
                " consolidate it (python -m multigpu.consolidate) and evaluate or continue the file under another"
                " strategy.",
                every_rank=True,
            )
        flat = StateDictOptions(flatten_optimizer_state_dict=True, cpu_offload=True)
        load_shards(path, checked, self.model, self.optimizers, self.lightning_module.strict_loading, flat)
        return checked.meta


@contextlib.contextmanager
def answered(module: nn.Module, name: str, value: Any) -> Iterator[None]:
    """Make ``module.NAME(...)`` return ``value`` inside the block (for this object only)."""
    setattr(module, name, lambda *args, **kwargs: value)
    try:
        yield
    finally:
        delattr(module, name)
