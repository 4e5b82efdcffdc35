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

A model is pipelined through three methods, which the GPT example has (README "Make it yours", pipeline):

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
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from src.compat import drop_own_method, set_device_mesh, set_mesh_sizes, set_own_method
from src.errors import ConfigurationError
from src.strategies.model_parallel import LIGHTNING_TIMEOUT, _ModelParallelMixin, clip_grad_norm

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch.distributed.pipelining import PipelineStage

#: the schedules by name: their classes in ``torch.distributed.pipelining``, imported by a pipeline run alone
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B"}
#: the schedules that run several stages per process (the others run one)
MULTI_STAGE = ("interleaved_1f1b",)
#: what a model defines to be pipelined (the module docstring)
PIPELINE_HOOKS = ("pipeline_stage", "pipeline_loss", "model_step")
#: the checkpoint's record of the split: a resume with another split is refused
CHECKPOINT_KEY = "pipeline"


def bubble_fraction(ranks: int, micro_batches: int, stages_per_rank: int = 1) -> float:
    """The share of a step each process idles while the pipeline fills and drains: ``(p - 1) / (v m + p - 1)`` for
    ``p`` ranks, ``m`` micro-batches and ``v`` stages per rank (``m >= p``). With one stage per rank (GPipe, 1F1B)
    it is ``(p - 1) / (m + p - 1)``; ``v`` stages per rank (interleaved 1F1B) make each fill and drain
    step ``v`` times shorter: Narayanan et al. 2021's bubble ``(p - 1) / (v m)`` of the ideal step time, here
    as a share of the whole step."""
    return (ranks - 1) / (stages_per_rank * micro_batches + ranks - 1)


def fits_rounds(micro_batches: int, ranks: int) -> bool:
    """Whether ``ScheduleInterleaved1F1B`` takes ``micro_batches``: it runs them in ``max(1, m // ranks)`` rounds of
    equal size."""
    return micro_batches >= 1 and micro_batches % max(1, micro_batches // ranks) == 0


def missing_hooks(model: Any) -> list[str]:
    return [name for name in PIPELINE_HOOKS if not callable(getattr(model, name, None))]


def pipeline_refusal(model_name: str, missing: list[str]) -> ConfigurationError:
    return ConfigurationError(
        f"--trainer.strategy=pipeline needs the model to say how its layers split into stages: {model_name} has no"
        f" {', '.join(missing)}. Fix: add pipeline_stage(index, count) (return the module that runs stage `index`,"
        " built from the model's own layers), pipeline_loss(output, target) and model_step(batch) (README \"Make it"
        ' yours", pipeline; src/models/gpt.py has all three), or use --trainer.strategy=fsdp2, which shards any'
        " model without code."
    )


@dataclass
class PipelineOptions:
    """``--pipeline.*``: the settings of ``--trainer.strategy=pipeline`` (given by name; a strategy given as a
    class takes them as its ``init_args``).

    Args:
        micro_batches: Micro-batches per batch (more shrink the bubble; ``gpipe`` and ``1f1b`` need at least one
            per pipeline rank).
        schedule: ``1f1b`` (a stage holds the activations of at most ``ranks`` micro-batches), ``gpipe``, or, with
            ``stages_per_rank`` >= 2, ``interleaved_1f1b``.
        stages_per_rank: Stages each process of a pipeline runs (stage ``s`` on pipeline rank ``s % ranks``): 1
            for ``gpipe`` and ``1f1b``, 2 or more for ``interleaved_1f1b``.
        data_parallel_size: Ranks that see different samples; each stage is sharded with FSDP2 over them.
        tensor_parallel_size: Ranks that split each layer of a stage (the model's ``configure_model`` plan).
    """

    micro_batches: int = 4
    schedule: Literal["1f1b", "gpipe", "interleaved_1f1b"] = "1f1b"
    stages_per_rank: int = 1
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1


def check_pipeline(
    options: PipelineOptions, processes: int, model_class: Any, batch_size: Any, accumulate: int
) -> None:
    """Refuse before launch what would fail or hang in every process: a model without the hooks, sizes that do not
    multiply to the process count, a schedule given the wrong number of stages per rank, fewer micro-batches than
    ranks under ``gpipe`` / ``1f1b`` (torch's schedules wait forever or refuse) or a count torch's interleaved
    schedules refuse, a batch that does not split into equal micro-batches (the stages exchange activations of one
    fixed shape). A split the model refuses (more stages than layers) is found by ``check_stages`` on the built
    model, also before launch."""
    missing = missing_hooks(model_class) if model_class is not None else []
    if missing:
        raise pipeline_refusal(model_class.__name__, missing)
    parallel = options.data_parallel_size * options.tensor_parallel_size
    if parallel < 1 or processes % parallel:
        raise ConfigurationError(
            f"--pipeline.data_parallel_size={options.data_parallel_size} x tensor_parallel_size="
            f"{options.tensor_parallel_size} does not divide the {processes} processes into pipelines. Fix: choose"
            " sizes whose product divides --trainer.devices x --trainer.num_nodes (the rest are the pipeline ranks)."
        )
    ranks, per_rank, micro_batches = processes // parallel, options.stages_per_rank, options.micro_batches
    if micro_batches < 1:
        raise ConfigurationError(
            f"--pipeline.micro_batches={micro_batches}: a batch splits into at least one micro-batch. Fix:"
            f" --pipeline.micro_batches={max(ranks, 1)} or more (more shrink the pipeline's idle share)."
        )
    multi = options.schedule in MULTI_STAGE
    if multi and (per_rank < 2 or ranks < 2):
        raise ConfigurationError(
            f"--pipeline.schedule={options.schedule} interleaves several stages on each of several processes; this"
            f" run has {ranks} pipeline rank(s) and --pipeline.stages_per_rank={per_rank}. Fix: at least 2 of each"
            " (e.g. --pipeline.stages_per_rank=2 over 2 or more processes per pipeline), or"
            " --pipeline.schedule=1f1b with one stage per rank."
        )
    if not multi and per_rank != 1:
        raise ConfigurationError(
            f"--pipeline.schedule={options.schedule} runs one stage per process, not --pipeline.stages_per_rank="
            f"{per_rank}. Fix: --pipeline.schedule=interleaved_1f1b to run several stages per rank,"
            " or --pipeline.stages_per_rank=1."
        )
    if not multi and micro_batches < ranks:
        raise ConfigurationError(
            f"--pipeline.micro_batches={micro_batches} is fewer than the {ranks} pipeline stages: the schedule would"
            f" wait forever for a micro-batch. Fix: --pipeline.micro_batches={ranks} or more (the idle share of a"
            f" step is (stages - 1) / (micro_batches + stages - 1))."
        )
    if options.schedule == "interleaved_1f1b" and not fits_rounds(micro_batches, ranks):
        below = next(m for m in range(micro_batches, 0, -1) if fits_rounds(m, ranks))
        above = next(m for m in itertools.count(max(micro_batches, 1)) if fits_rounds(m, ranks))
        raise ConfigurationError(
            f"--pipeline.micro_batches={micro_batches} is not a count {options.schedule} takes: torch runs the"
            f" micro-batches in max(1, micro_batches // {ranks} pipeline ranks) rounds, which must divide them."
            f" Fix: --pipeline.micro_batches={below} or {above} (any multiple of {ranks} works)."
        )
    samples = batch_size // (options.data_parallel_size * accumulate) if isinstance(batch_size, int) else None
    if samples is not None and (samples < micro_batches or samples % micro_batches):
        raise ConfigurationError(
            f"--data.batch_size={batch_size} gives {samples} samples per data-parallel rank and batch (over"
            f" data_parallel_size={options.data_parallel_size} and accumulate_grad_batches={accumulate}), which do"
            f" not split into --pipeline.micro_batches={micro_batches} equal micro-batches. Fix: make"
            f" --data.batch_size a multiple of {options.data_parallel_size * accumulate * micro_batches}."
        )


def check_stages(model: nn.Module, count: int) -> None:
    """Build every stage once, on the model built before launch (cheap: a stage shares the model's layers), so that
    a split the model refuses, a hook that changes the model, or a parameter no stage holds (it would never
    train) is refused in one paragraph here, not in every process."""
    names = [name for name, _ in model.named_parameters()]
    stages = [model.pipeline_stage(index, count) for index in range(count)]
    kind = type(model).__name__
    if [name for name, _ in model.named_parameters()] != names:
        raise ConfigurationError(
            f"{kind}.pipeline_stage changed the model (its parameters are not the ones it had): the strategy calls"
            " it for every stage a process holds, and removes the other stages' layers itself. Fix: build the"
            " stage's module from the model's layers without deleting or replacing any (README \"Make it yours\","
            " pipeline)."
        )
    if not all(isinstance(stage, nn.Module) for stage in stages):
        raise ConfigurationError(
            f"{kind}.pipeline_stage returned a {type(next(s for s in stages if not isinstance(s, nn.Module))).__name__}"
            " where the strategy runs an nn.Module. Fix: return a module holding the stage's layers."
        )
    held = {id(parameter) for stage in stages for parameter in stage.parameters()}
    orphans = [name for name, parameter in model.named_parameters() if id(parameter) not in held]
    if orphans:
        raise ConfigurationError(
            f"{kind}.pipeline_stage leaves {len(orphans)} parameter(s) in no stage of {count} (e.g. {orphans[0]}):"
            " they would never train. Fix: give each layer to one stage (the first for embeddings, the last for the"
            " output layer)."
        )


def shard_stages(stages: dict[int, nn.Module], mesh: Any, model_name: str) -> None:
    """Make each stage the FSDP2 root of what the model's ``configure_model`` left unsharded in it (the GPT's
    embeddings and head), over the data-parallel ``mesh``, as ``torch.distributed.pipelining`` wants a stage: its
    schedules then gather and reduce each stage's parameters once per step, not per micro-batch. A model that
    sharded a module around a stage's layers (its whole network) is refused: no process runs that module."""
    for index, stage in stages.items():
        if isinstance(stage, FSDPModule):
            continue  # sharded for an earlier run of this Trainer
        inner = {id(p) for layer in stage.modules() if isinstance(layer, FSDPModule) for p in layer.parameters()}
        outer = [p for p in stage.parameters() if id(p) not in inner and isinstance(p, DTensor)]
        if any(p.device_mesh.mesh_dim_names == mesh.mesh_dim_names for p in outer):
            raise ConfigurationError(
                f"{model_name}.configure_model sharded a module around the layers of pipeline stage {index} (e.g."
                " fully_shard(self.net), the whole network), which under --trainer.strategy=pipeline no process"
                " runs. Fix: shard only the layers (each block) when self.device_mesh has a 'pipeline' dimension,"
                " as src/models/gpt.py does: the strategy shards the rest of each stage."
            )
        fully_shard(stage, mesh=mesh)


class HeldElsewhere(nn.Module):
    """Stands in for a layer that another pipeline process holds: no parameters, so the names of those this
    process keeps stay one device's (``net.blocks.2.…``), as the sharded checkpoints want."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "this layer is held by another pipeline process: under --trainer.strategy=pipeline the strategy runs the"
            " stages (pipeline_stage), not the whole model"
        )


def remove_other_stages(module: nn.Module, stages: list[nn.Module]) -> None:
    """Replace in ``module`` each submodule that holds parameters or buffers and that none of ``stages`` runs by a
    ``HeldElsewhere``; the ancestors of a stage's layers stay, with what the stages use in them."""
    used = {id(layer) for stage in stages for layer in stage.modules()}

    def prune(parent: nn.Module) -> None:
        for name, child in list(parent.named_children()):
            if id(child) in used:
                continue
            if any(id(layer) in used for layer in child.modules()):
                prune(child)
            elif next(child.parameters(), None) is not None or next(child.buffers(), None) is not None:
                setattr(parent, name, HeldElsewhere())

    prune(module)


class PipelineStrategy(_ModelParallelMixin, ModelParallelStrategy):
    """Pipeline stages over processes, each stage sharded with FSDP2 (and split with tensor parallelism).

    Args:
        pipeline_size: Processes of one pipeline (``"auto"``: the world size over the data- and tensor-parallel
            sizes).
        micro_batches: Micro-batches per batch (at least ``pipeline_size`` under ``gpipe`` and ``1f1b``; more
            shrink the bubble).
        schedule: ``1f1b``, ``gpipe`` (one stage per process) or ``interleaved_1f1b`` (several).
        stages_per_rank: Stages each process runs: ``pipeline_size x stages_per_rank`` stages in all, stage ``s``
            on pipeline rank ``s % pipeline_size``.
        data_parallel_size: Ranks that see different samples (FSDP2 shards each stage over them).
        tensor_parallel_size: Ranks that split each layer of a stage.
        save_distributed_checkpoint: Save a folder of shards (one file per rank), the default.
        process_group_backend: ``nccl`` on GPUs, ``gloo`` on the CPU unless given.
        timeout: How long a collective waits for the other ranks.
    """

    strategy_name = "pipeline"

    def __init__(
        self,
        pipeline_size: Literal["auto"] | int = "auto",
        micro_batches: int = 4,
        schedule: Literal["1f1b", "gpipe", "interleaved_1f1b"] = "1f1b",
        stages_per_rank: int = 1,
        data_parallel_size: int = 1,
        tensor_parallel_size: int = 1,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = LIGHTNING_TIMEOUT,
    ) -> None:
        if schedule not in SCHEDULES:
            names = ", ".join(SCHEDULES)
            raise ConfigurationError(f"schedule={schedule} is not a pipeline schedule. Fix: one of {names}.")
        super().__init__(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.sharded_checkpoints = save_distributed_checkpoint
        self.pipeline_size = pipeline_size
        self.micro_batches = micro_batches
        self.schedule_name = schedule
        self.stages_per_rank = stages_per_rank
        self.data_parallel = data_parallel_size
        self.tensor_parallel = tensor_parallel_size
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
        return max(1, self.num_nodes * self.num_processes // (self.data_parallel * self.tensor_parallel))

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
        missing = missing_hooks(module) if module is not None else []
        if missing:  # before any process group: every rank would raise later
            raise pipeline_refusal(type(module).__name__, missing)
        world = self.num_nodes * self.num_processes
        if self.ranks * self.data_parallel * self.tensor_parallel != world:
            raise ConfigurationError(
                f"--trainer.strategy.pipeline_size={self.ranks} x data_parallel_size={self.data_parallel} x"
                f" tensor_parallel_size={self.tensor_parallel} must be the number of processes ({world}). Fix: set"
                " --trainer.devices and --trainer.num_nodes to their product, or change the sizes."
            )
        # Lightning's 2-D mesh is built first (its checks, its process group); the pipeline then takes the outer
        # dimension of a 3-D mesh, whose data-parallel and tensor-parallel dimensions the model's hook uses
        set_mesh_sizes(self, data_parallel=self.ranks * self.data_parallel, tensor_parallel=self.tensor_parallel)
        super().setup_environment()
        mesh = init_device_mesh(
            self.root_device.type,
            (self.ranks, self.data_parallel, self.tensor_parallel),
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
        set_own_method(self.precision_plugin, "clip_grad_by_norm", self._clip_grad_by_norm)
        #: this process's end of each tied weight (None between the ends), found once: the sharded parameters exist now
        self._tied_held = self._held_tied()
        held = [(index, _layer_count(stage), sum(p.numel() for p in stage.parameters())) for index, stage in
                self.stage_modules.items()]  # fmt: skip
        gathered: list[Any] = [None] * self.ranks
        dist.all_gather_object(gathered, held, group=self.pipeline_group)
        stages = sorted(stage for of_rank in gathered for stage in of_rank)
        self.stage_sizes = [(layers, parameters) for _, layers, parameters in stages]

    def pipeline_plan(self) -> dict[str, Any]:
        """The run plan's pipeline lines (``src/callbacks/run_plan.py``): the split and its idle share."""
        per_rank = self.stages_per_rank
        formula = "(ranks - 1) / (" + ("micro_batches" if per_rank == 1 else "stages_per_rank x micro_batches")
        formula += " + ranks - 1)"
        return {
            "pipeline_stages": self.stage_count if per_rank == 1 else f"{self.stage_count} ({per_rank} per rank)",
            "micro_batches": self.micro_batches,
            "schedule": self.schedule_name,
            "layers_per_stage": [str(layers) for layers, _ in self.stage_sizes],
            "parameters_per_stage": [str(parameters) for _, parameters in self.stage_sizes],
            "bubble_fraction": f"{bubble_fraction(self.ranks, self.micro_batches, per_rank):.3f} (idle share of a"
            f" step: {formula})",
        }

    def teardown(self) -> None:
        drop_own_method(self.precision_plugin, "clip_grad_by_norm")
        self._schedule = None
        self.pipeline_stages = []
        super().teardown()

    def _schedule_for(self, batch_size: int) -> Any:
        """The schedule of this process's stages, built at the first batch (``PipelineStage`` needs static
        shapes)."""
        if self._schedule is None:
            if batch_size % self.micro_batches:
                raise ConfigurationError(
                    f"a batch of {batch_size} samples per data-parallel rank does not split into"
                    f" --trainer.strategy.micro_batches={self.micro_batches} equal micro-batches. Fix: make"
                    " --data.batch_size / data_parallel_size a multiple of micro_batches."
                )
            from torch.distributed import pipelining  # every run imports this module (the registry); few use it

            stages = [
                pipelining.PipelineStage(stage, index, self.stage_count, self.root_device, group=self.pipeline_group)
                for index, stage in self.stage_modules.items()
            ]
            held = stages if self.schedule_name in MULTI_STAGE else stages[0]
            self._schedule = getattr(pipelining, SCHEDULES[self.schedule_name])(
                held, self.micro_batches, loss_fn=self._micro_batch_loss, scale_grads=False
            )
            self.pipeline_stages = stages
        return self._schedule

    def _micro_batch_loss(self, output: Tensor, target: Tensor) -> Tensor:
        # the schedule backpropagates each micro-batch's loss: the mean over micro-batches and the accumulated
        # batches is what one device's backward of the batch mean (divided by Lightning's accumulation) gives
        trainer = self.lightning_module.trainer
        scale = self.micro_batches * trainer.accumulate_grad_batches
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
        self._sum_tied_gradients(dict(pending))
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

    def _sum_tied_gradients(self, new: dict[nn.Parameter, Tensor | None]) -> None:
        """Sum this step's gradients of each tied weight over its two ends (the first and the last stage, on the
        first and the last pipeline rank; the ranks between add zeros), so that both copies take the step one device
        takes. With one rank, both ends are one parameter of one process."""
        if self.ranks == 1:
            return
        group, device = self.pipeline_group, self.root_device
        for parameter in self._tied_held:
            grad = new.get(parameter) if parameter is not None else None
            local = _local(grad) if grad is not None else None
            shape, dtype = _broadcast_header(local, group, src=self.ranks - 1, device=device)
            dist.all_reduce(local if local is not None else torch.zeros(shape, dtype=dtype, device=device), group=group)

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
        set_own_method(self.lightning_module, "forward", self.forward_through_stages)
        try:
            yield
        finally:
            drop_own_method(self.lightning_module, "forward")
            # an FSDP2 root keeps its parameters gathered after a forward, for the backward that follows in
            # training; none follows an evaluation, and with the copy it gathered there, the next training step's
            # gradients of the stage's own parameters (embeddings, head) would not reach them
            for stage in self.stage_modules.values():
                if isinstance(stage, FSDPModule):
                    stage.reshard()

    def forward_through_stages(self, inputs: Tensor) -> Tensor:
        """The model's forward, stage after stage (no micro-batches: any batch size), its output on every process
        of the pipeline. Each process runs its stages in order, receiving each one's input from the process of the
        stage before and sending its output to the one of the stage after."""
        group, ranks, device = self.pipeline_group, self.ranks, self.root_device
        x: Tensor | None = inputs
        for index, stage in self.stage_modules.items():
            if index > 0 and (index - 1) % ranks != self.pipeline_rank:
                x = _receive(group, (index - 1) % ranks, device)
            x = stage(x)
            if index < self.stage_count - 1 and (index + 1) % ranks != self.pipeline_rank:
                _send(x, group, (index + 1) % ranks)
        output = x if self.is_last else None
        shape, dtype = _broadcast_header(output, group, src=ranks - 1, device=device)
        output = output if output is not None else torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(output, group=group, group_src=ranks - 1)
        return output

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
        layout); ``src/checkpoints/sharded.py`` puts them back in one device's order."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(
            full_state_dict=not self.sharded_checkpoints, cpu_offload=True, flatten_optimizer_state_dict=True
        )
        optimizer = getattr(optimizer, "optimizer", optimizer)
        return get_optimizer_state_dict(self.model, optimizer, options=options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Each rank reads its stages' part of a folder a pipeline run saved, checked first (its index, entries and
        ``meta.pt`` read without running code: ``src/checkpoints/safe.py``); returns ``meta.pt``'s state."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        from src.checkpoints.sharded import check_sharded_checkpoint, load_shards

        path = Path(self.broadcast(str(checkpoint_path)))
        if not path.is_dir():
            raise ConfigurationError(
                f"--ckpt_path={path} is not a sharded pipeline checkpoint: a pipeline run resumes from the folder a"
                " pipeline run saved. Fix: pass that folder (e.g. runs/NAME/checkpoints/last.ckpt); to evaluate"
                " a single-file checkpoint, run validate/test/predict with another strategy."
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
                " strategy."
            )
        flat = StateDictOptions(flatten_optimizer_state_dict=True, cpu_offload=True)
        load_shards(path, checked, self.model, self.optimizers, self.lightning_module.strict_loading, flat)
        return checked.meta

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="Pipeline parallel: layers in stages over ranks, FSDP2 within a stage"
        )


def register_pipeline_strategy() -> None:
    """Make ``strategy="pipeline"`` resolve to ``PipelineStrategy`` (idempotent)."""
    if PipelineStrategy.strategy_name not in StrategyRegistry:
        PipelineStrategy.register_strategies(StrategyRegistry)


@contextlib.contextmanager
def answered(module: nn.Module, name: str, value: Any) -> Iterator[None]:
    """Make ``module.NAME(...)`` return ``value`` inside the block (for this object only)."""
    set_own_method(module, name, lambda *args, **kwargs: value)
    try:
        yield
    finally:
        drop_own_method(module, name)


def tied_parameter_names(module: nn.Module) -> list[tuple[str, str]]:
    """Pairs ``(first name, other name)`` of one parameter registered under two names (a tied weight)."""
    first_name: dict[int, str] = {}
    pairs = []
    for name, parameter in module.named_parameters(remove_duplicate=False):
        if id(parameter) in first_name:
            pairs.append((first_name[id(parameter)], name))
        else:
            first_name[id(parameter)] = name
    return pairs


def _layer_count(stage: nn.Module) -> int | None:
    layers = getattr(stage, "layers", None)  # the GPT's stages say how many blocks they run
    return len(layers()) if callable(layers) else None


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


#: dtypes an activation may have, by position in the header a stage sends before it
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


def _broadcast_shape(tensor: Tensor | None, group: dist.ProcessGroup, src: int) -> torch.Size:
    holder = [tuple(tensor.shape) if tensor is not None else None]
    dist.broadcast_object_list(holder, group=group, group_src=src)
    return torch.Size(holder[0])
