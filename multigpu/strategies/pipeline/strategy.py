"""``strategy="pipeline"``: whole layers on different devices, run in sequence over micro-batches.

Pipeline parallelism as the article first defines model parallelism: the model's layers are cut into stages, held
by the processes of a pipeline group, and a batch is split into micro-batches that flow through the stages, so
that every stage works on one micro-batch while the next waits for it. The schedules are PyTorch's
(``torch.distributed.pipelining``): ``gpipe`` (all forwards, then all backwards) and ``1f1b`` (one forward, one
backward: a stage holds the activations of at most ``ranks`` micro-batches) run one stage per process;
``interleaved_1f1b`` (1F1B over several stages per process, Narayanan et al. 2021) runs ``stages_per_rank`` of
them, stage ``s`` on pipeline rank ``s % ranks`` (torch's loop layout), which shrinks the bubble by that factor.

The processes form a 3-D device mesh ``(pipeline, data_parallel, tensor_parallel)``: each pipeline stage is
sharded with FSDP2 over the data-parallel ranks (always, also over one rank, so that its parameters are DTensors
as the sharded checkpoints want) and split with tensor parallelism where ``tensor_parallel_size`` > 1, by the
model's own ``configure_model`` (the GPT example's), which shards the layers; the strategy then shards each stage
as the root of its rest (embeddings, head). The global batch (``--data.batch_size``) keeps its meaning: the
samples of one optimizer step, split over the data-parallel ranks, then into ``micro_batches``.

A model is pipelined through three methods, which the GPT example has (docs/models.md, "pipeline"):

- ``pipeline_stage(index, count)``: the module that runs stage ``index`` of ``count``, built from the model's own
  layers (shared, not copied; the model itself unchanged), from the previous stage's output (the batch's inputs
  on the first stage) to the next stage's input (the logits on the last). The strategy calls it for the stages
  a process holds, then replaces in the LightningModule every layer holding parameters that none of them runs
  by a placeholder (``HeldElsewhere``): the parameters a process keeps have one device's names;
- ``pipeline_loss(output, target)``: the mean loss of one micro-batch from the last stage's output;
- ``model_step(batch)``: the loss of a batch ``(inputs, targets)``, which its ``training_step`` calls. Under this
  strategy it is answered from the pipeline (the stages ran the forward and backward already), so the model's
  own ``training_step`` logs and updates its metrics unchanged.

Evaluation and prediction run the stages forward, one after the other, and give every stage the last stage's
output: ``validation_step``, ``test_step`` and ``predict_step`` run as they are, with the numbers of one device
(a prediction writer writes once per pipeline with ``prediction_replica``). Tied weights (the GPT's output layer
is its token embedding) live on the first and last stage, on pipeline ranks 0 and ``ranks - 1``: their
gradients are summed over the two before each optimizer step, so both copies stay equal. Gradient clipping takes
the norm over every stage (and counts a tied weight once).
"""

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
from multigpu.hook_readers import missing_pipeline_hooks, stage_layer_count
from multigpu.strategies.model_parallel import LIGHTNING_TIMEOUT, _ModelParallelMixin, clip_grad_norm
from multigpu.strategies.pipeline.exchange import forward_through_stages, sum_tied_gradients
from multigpu.strategies.pipeline.options import MULTI_STAGE, SCHEDULES, PipelineOptions, pipeline_refusal, split_plan
from multigpu.strategies.pipeline.stages import remove_other_stages, shard_stages, tied_parameter_names

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch.distributed.pipelining import PipelineStage

#: the checkpoint's record of the split: a resume with another split is refused
CHECKPOINT_KEY = "pipeline"


class PipelineStrategy(_ModelParallelMixin, ModelParallelStrategy):
    """Pipeline stages over processes, each stage sharded with FSDP2 (and split with tensor parallelism).

    Args:
        pipeline_size: Processes of one pipeline (``"auto"``: the world size over the data- and tensor-parallel
            sizes).
        save_distributed_checkpoint: Save a folder of shards (one file per rank), the default.
        process_group_backend: ``nccl`` on GPUs, ``gloo`` on the CPU unless given.
        timeout: How long a collective waits for the other ranks.
        options: The settings of ``PipelineOptions`` by name (``micro_batches``, ``schedule``, ``stages_per_rank``,
            ``data_parallel_size``, ``tensor_parallel_size``; ``--pipeline.*`` for the strategy given by name).
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
        self.options = PipelineOptions(**options)  # the settings are declared there alone (their help too)
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
        #: the stages this process runs, by stage index
        self.stage_modules: dict[int, nn.Module] = {}
        self.pipeline_rank = 0
        self._schedule: Any = None
        #: this rank's stages (``PipelineStage``), built with the schedule at the first training batch (the benchmark
        #: times their work: benchmarks/timing.py)
        self.pipeline_stages: list[PipelineStage] = []
        self._batch_shape: torch.Size | None = None
        self._pending: list[tuple[nn.Parameter, Tensor | None]] = []

    # -- the mesh and the cut -----------------------------------------------------------------------------------

    @property
    def ranks(self) -> int:
        """Processes of one pipeline."""
        if self.pipeline_size != "auto":
            return int(self.pipeline_size)
        parallel = self.options.data_parallel_size * self.options.tensor_parallel_size
        return max(1, self.num_nodes * self.num_processes // parallel)

    @property
    def stages_per_rank(self) -> int:
        """Stages each process runs (``--pipeline.stages_per_rank``)."""
        return self.options.stages_per_rank

    @property
    def stage_count(self) -> int:
        """Stages of the model: ``stages_per_rank`` on each pipeline rank."""
        return self.ranks * self.stages_per_rank

    @property
    def pipeline_group(self) -> dist.ProcessGroup:
        return self.device_mesh["pipeline"].get_group()

    @property
    def is_first(self) -> bool:
        """Whether this process runs the first stage (torch's loop layout: stage ``s`` on rank ``s % ranks``)."""
        return self.pipeline_rank == 0

    @property
    def is_last(self) -> bool:
        """Whether this process runs the last stage."""
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
        # Lightning's 2-D mesh is built first (its checks, its process group); the pipeline then takes the outer
        # dimension of a 3-D mesh, whose data-parallel and tensor-parallel dimensions the model's hook uses
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
        self.parameter_order = [name for name, _ in module.named_parameters()]  # one device's, tied weights once
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
        # this plugin only: its clip_gradients calls self.clip_grad_by_norm
        self.precision_plugin.clip_grad_by_norm = self._clip_grad_by_norm
        #: this process's end of each tied weight (None between the ends), found once: the sharded parameters exist now
        self._tied_held = self._held_tied()
        held = [(index, stage_layer_count(stage), sum(p.numel() for p in stage.parameters())) for index, stage in
                self.stage_modules.items()]  # fmt: skip
        gathered: list[Any] = [None] * self.ranks
        dist.all_gather_object(gathered, held, group=self.pipeline_group)
        stages = sorted(stage for of_rank in gathered for stage in of_rank)
        self.stage_sizes = [(layers, parameters) for _, layers, parameters in stages]

    def pipeline_plan(self) -> dict[str, Any]:
        """The run plan's pipeline lines (``multigpu/callbacks/run_plan.py``): the split and its idle share."""
        return split_plan(self.options, self.ranks, self.stage_sizes)

    def teardown(self) -> None:
        vars(self.precision_plugin).pop("clip_grad_by_norm", None)  # the class's clipping again
        self._schedule = None
        self.pipeline_stages = []
        super().teardown()

    def _schedule_for(self, batch_size: int) -> Any:
        """The schedule of this process's stages, built at the first batch (``PipelineStage`` needs static
        shapes)."""
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
        # the schedule backpropagates each micro-batch's loss: the mean over micro-batches and the accumulated
        # batches is what one device's backward of the batch mean (divided by Lightning's accumulation) gives
        trainer = self.lightning_module.trainer
        scale = self.options.micro_batches * trainer.accumulate_grad_batches
        return self.lightning_module.pipeline_loss(output, target) / scale

    # -- training --------------------------------------------------------------------------------------------------

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
        # Lightning zeroes the gradients between training_step and backward: the schedule's gradients (its
        # backward runs here, interleaved with the forwards) are set aside and added in backward()
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
        # the batch's mean loss, from the last stage's process to the others: the model logs it as one device would
        loss = torch.zeros((), dtype=torch.float64, device=self.root_device)
        if self.is_last:
            loss += torch.stack([value.detach().double() for value in losses]).sum()
            loss *= self.lightning_module.trainer.accumulate_grad_batches
        dist.broadcast(loss, group=self.pipeline_group, group_src=self.ranks - 1)
        loss = loss.to(self._loss_dtype())
        with answered(self.lightning_module, "model_step", loss):
            return self.lightning_module.training_step(*args, **kwargs)

    def backward(self, closure_loss: Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> Tensor:
        """Add the gradients the schedule computed in ``training_step`` (every micro-batch's backward ran there)."""
        pending, self._pending = self._pending, []
        sum_tied_gradients(self._tied_held, dict(pending), self.pipeline_group, self.ranks, self.root_device)
        for parameter, grad in pending:
            if grad is not None:
                parameter.grad = grad if parameter.grad is None else parameter.grad + grad
        return closure_loss

    def _loss_dtype(self) -> torch.dtype:
        dtype = next((p.dtype for p in self.lightning_module.parameters()), torch.float32)
        return dtype if dtype in (torch.float32, torch.float64) else torch.float32

    # -- tied weights and clipping ---------------------------------------------------------------------------------

    def _held_tied(self) -> list[nn.Parameter | None]:
        named = dict(self.lightning_module.named_parameters())
        end = (lambda first, last: first) if self.is_first else (lambda first, last: last) if self.is_last else None
        return [named.get(end(first, last)) if end is not None else None for first, last in self.tied]

    def _clip_grad_by_norm(self, optimizer: Any, clip_val: float) -> None:
        # a tied weight counts once, on the first stage
        counted_elsewhere = {id(p) for p in self._tied_held if p is not None} if not self.is_first else set()
        clip_grad_norm(
            list(self.precision_plugin.main_params(optimizer)),
            clip_val,
            reduce_group=self.pipeline_group,
            not_in_norm=counted_elsewhere,
        )

    # -- evaluation ------------------------------------------------------------------------------------------------

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
        # the user's forward replaced on the instance (not the class): self(x) in their step runs the stages
        self.lightning_module.forward = self.forward_through_stages
        try:
            yield
        finally:
            vars(self.lightning_module).pop("forward", None)  # the class's forward again
            # an FSDP2 root keeps its parameters gathered after a forward, for the backward that follows in
            # training; none follows an evaluation, and with the copy it gathered there, the next training step's
            # gradients of the stage's own parameters (embeddings, head) would not reach them
            for stage in self.stage_modules.values():
                if isinstance(stage, FSDPModule):
                    stage.reshard()

    def forward_through_stages(self, inputs: Tensor) -> Tensor:
        """The model's forward, stage after stage (no micro-batches: any batch size), its output on every process
        of the pipeline."""
        stages, group, rank = self.stage_modules, self.pipeline_group, self.pipeline_rank
        return forward_through_stages(stages, inputs, group, rank, self.ranks, self.stage_count, self.root_device)

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "stages": self.stage_count,
            "stages_per_rank": self.stages_per_rank,
            "parameter_order": self.parameter_order,
        }
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """Each stage's optimizer state keyed by parameter name and setting (``state.NAME.exp_avg``,
        ``param_groups.NAME.lr``): the stages' keys are disjoint, as a sharded checkpoint wants them (torchtitan's
        layout); ``multigpu/checkpoints/sharded.py`` puts them back in one device's order."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(
            full_state_dict=not self.sharded_checkpoints,
            cpu_offload=self.offloads_state,
            flatten_optimizer_state_dict=True,
        )
        optimizer = getattr(optimizer, "optimizer", optimizer)
        return get_optimizer_state_dict(self.model, optimizer, options=options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Each rank reads its stages' part of a folder a pipeline run saved, checked first (its index, entries and
        ``meta.pt`` read without running code: ``multigpu/checkpoints/safe.py``); returns ``meta.pt``'s state."""
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
        checked = check_sharded_checkpoint(path, map_location=None)  # meta.pt's tensors where saved, as before
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
                " consolidate it (python -m src.consolidate) and evaluate or continue the file under another"
                " strategy.",
                every_rank=True,
            )
        flat = StateDictOptions(flatten_optimizer_state_dict=True, cpu_offload=True)
        load_shards(path, checked, self.model, self.optimizers, self.lightning_module.strict_loading, flat)
        return checked.meta


@contextlib.contextmanager
def answered(module: nn.Module, name: str, value: Any) -> Iterator[None]:
    """Make ``module.NAME(...)`` return ``value`` inside the block (for this object only)."""
    setattr(module, name, lambda *args, **kwargs: value)  # an attribute of the instance hides the class's method
    try:
        yield
    finally:
        delattr(module, name)
