"""``strategy="pipeline"``: whole layers on different devices, run in sequence over micro-batches.

Pipeline parallelism as the article first defines model parallelism: the model's layers are cut into stages, one
per process of a pipeline group, and a batch is split into micro-batches that flow through the stages, so that
every stage works on one micro-batch while the next waits for it. The schedules are PyTorch's
(``torch.distributed.pipelining``): ``gpipe`` (all forwards, then all backwards) and ``1f1b`` (one forward, one
backward: a stage holds the activations of at most ``stages`` micro-batches).

The processes form a 3-D device mesh ``(pipeline, data_parallel, tensor_parallel)``: each pipeline stage is
sharded with FSDP2 over the data-parallel ranks (always, also over one rank, so that its parameters are DTensors
as the sharded checkpoints want) and split with tensor parallelism where ``tensor_parallel_size`` > 1, by the
model's own ``configure_model`` (the GPT example's). The global batch (``--data.batch_size``) keeps its meaning:
the samples of one optimizer step, split over the data-parallel ranks, then into ``micro_batches``.

A model is pipelined through three methods, which the GPT example has (README "Make it yours", pipeline):

- ``pipeline_stage(index, count)``: keep only the layers of stage ``index`` of ``count`` (deleting the others'
  parameters, keeping the names of the kept ones) and return the module that runs them, from the previous stage's
  output (the batch's inputs on the first stage) to the next stage's input (the logits on the last);
- ``pipeline_loss(output, target)``: the mean loss of one micro-batch from the last stage's output;
- ``model_step(batch)``: the loss of a batch ``(inputs, targets)``, which its ``training_step`` calls. Under this
  strategy it is answered from the pipeline (the stages ran the forward and backward already), so the model's
  own ``training_step`` logs and updates its metrics unchanged.

Evaluation and prediction run the stages forward, one after the other, and give every stage the last stage's
output: ``validation_step``, ``test_step`` and ``predict_step`` run as they are, with the numbers of one device.
Tied weights (the GPT's output layer is its token embedding) live on the first and last stage: their gradients
are summed over the two before each optimizer step, so both copies stay equal. Gradient clipping takes the norm
over every stage (and counts a tied weight once).
"""

from __future__ import annotations

import contextlib
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
from torch.distributed.tensor import DTensor

from src.compat import drop_own_method, set_device_mesh, set_mesh_sizes, set_own_method
from src.errors import ConfigurationError
from src.strategies.model_parallel import LIGHTNING_TIMEOUT, _ModelParallelMixin, clip_grad_norm

if TYPE_CHECKING:
    import lightning.pytorch as pl

#: the schedules by name: their classes in ``torch.distributed.pipelining``, imported by a pipeline run alone
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}
#: what a model defines to be pipelined (the module docstring)
PIPELINE_HOOKS = ("pipeline_stage", "pipeline_loss", "model_step")
#: the checkpoint's record of the split: a resume with another stage count is refused
CHECKPOINT_KEY = "pipeline"


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The share of a step each stage idles while the pipeline fills and drains, ``(p - 1) / (m + p - 1)`` for
    ``p`` stages and ``m`` micro-batches under GPipe and 1F1B alike."""
    return (stages - 1) / (micro_batches + stages - 1)


def missing_hooks(model: Any) -> list[str]:
    return [name for name in PIPELINE_HOOKS if not callable(getattr(model, name, None))]


def pipeline_refusal(model_name: str, missing: list[str]) -> ConfigurationError:
    return ConfigurationError(
        f"--trainer.strategy=pipeline needs the model to say how its layers split into stages: {model_name} has no"
        f" {', '.join(missing)}. Fix: add pipeline_stage(index, count) (keep stage `index`'s layers, return the"
        ' module that runs them), pipeline_loss(output, target) and model_step(batch) (README "Make it yours",'
        " pipeline; src/models/gpt.py has all three), or use --trainer.strategy=fsdp2, which shards any model"
        " without code."
    )


@dataclass
class PipelineOptions:
    """``--pipeline.*``: the settings of ``--trainer.strategy=pipeline`` (given by name; a strategy given as a
    class takes them as its ``init_args``).

    Args:
        micro_batches: Micro-batches per batch (at least the number of stages; more shrink the bubble).
        schedule: ``1f1b`` (a stage holds the activations of at most ``stages`` micro-batches) or ``gpipe``.
        data_parallel_size: Ranks that see different samples; each stage is sharded with FSDP2 over them.
        tensor_parallel_size: Ranks that split each layer of a stage (the model's ``configure_model`` plan).
    """

    micro_batches: int = 4
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1


def check_pipeline(
    options: PipelineOptions, processes: int, model_class: Any, batch_size: Any, accumulate: int
) -> None:
    """Refuse before launch what would fail or hang in every process: a model without the hooks, sizes that do not
    multiply to the process count, fewer micro-batches than stages (torch's schedules wait forever), a batch that
    does not split into equal micro-batches (the stages exchange activations of one fixed shape)."""
    missing = missing_hooks(model_class) if model_class is not None else []
    if missing:
        raise pipeline_refusal(model_class.__name__, missing)
    parallel = options.data_parallel_size * options.tensor_parallel_size
    if parallel < 1 or processes % parallel:
        raise ConfigurationError(
            f"--pipeline.data_parallel_size={options.data_parallel_size} x tensor_parallel_size="
            f"{options.tensor_parallel_size} does not divide the {processes} processes into pipelines. Fix: choose"
            " sizes whose product divides --trainer.devices x --trainer.num_nodes (the rest are the stages)."
        )
    stages = processes // parallel
    if options.micro_batches < stages:
        raise ConfigurationError(
            f"--pipeline.micro_batches={options.micro_batches} is fewer than the {stages} pipeline stages: the"
            f" schedule would wait forever for a micro-batch. Fix: --pipeline.micro_batches={stages} or more (the"
            f" idle share of a step is (stages - 1) / (micro_batches + stages - 1))."
        )
    per_rank = batch_size // (options.data_parallel_size * accumulate) if isinstance(batch_size, int) else None
    if per_rank is not None and (per_rank < options.micro_batches or per_rank % options.micro_batches):
        raise ConfigurationError(
            f"--data.batch_size={batch_size} gives {per_rank} samples per data-parallel rank and batch (over"
            f" data_parallel_size={options.data_parallel_size} and accumulate_grad_batches={accumulate}), which do"
            f" not split into --pipeline.micro_batches={options.micro_batches} equal micro-batches. Fix: make"
            f" --data.batch_size a multiple of {options.data_parallel_size * accumulate * options.micro_batches}."
        )


class PipelineStrategy(_ModelParallelMixin, ModelParallelStrategy):
    """Pipeline stages over processes, each stage sharded with FSDP2 (and split with tensor parallelism).

    Args:
        pipeline_size: Stages, one per rank of a pipeline group (``"auto"``: the world size over the data- and
            tensor-parallel sizes).
        micro_batches: Micro-batches per batch (at least ``pipeline_size``; more shrink the bubble).
        schedule: ``1f1b`` or ``gpipe``.
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
        schedule: Literal["1f1b", "gpipe"] = "1f1b",
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
        self.data_parallel = data_parallel_size
        self.tensor_parallel = tensor_parallel_size
        self.stage_module: nn.Module | None = None
        self.stage_index = 0
        self._schedule: Any = None
        self._batch_shape: torch.Size | None = None
        self._pending: list[tuple[nn.Parameter, Tensor | None]] = []

    # -- the mesh and the cut -----------------------------------------------------------------------------------

    @property
    def stages(self) -> int:
        if self.pipeline_size != "auto":
            return int(self.pipeline_size)
        return max(1, self.num_nodes * self.num_processes // (self.data_parallel * self.tensor_parallel))

    @property
    def pipeline_group(self) -> dist.ProcessGroup:
        return self.device_mesh["pipeline"].get_group()

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.stages - 1

    def setup_environment(self) -> None:
        module = self.lightning_module
        missing = missing_hooks(module) if module is not None else []
        if missing:  # before any process group: every rank would raise later
            raise pipeline_refusal(type(module).__name__, missing)
        world = self.num_nodes * self.num_processes
        if self.stages * self.data_parallel * self.tensor_parallel != world:
            raise ConfigurationError(
                f"--trainer.strategy.pipeline_size={self.stages} x data_parallel_size={self.data_parallel} x"
                f" tensor_parallel_size={self.tensor_parallel} must be the number of processes ({world}). Fix: set"
                " --trainer.devices and --trainer.num_nodes to their product, or change the sizes."
            )
        # Lightning's 2-D mesh is built first (its checks, its process group); the pipeline then takes the outer
        # dimension of a 3-D mesh, whose data-parallel and tensor-parallel dimensions the model's hook uses
        set_mesh_sizes(self, data_parallel=self.stages * self.data_parallel, tensor_parallel=self.tensor_parallel)
        super().setup_environment()
        mesh = init_device_mesh(
            self.root_device.type,
            (self.stages, self.data_parallel, self.tensor_parallel),
            mesh_dim_names=("pipeline", "data_parallel", "tensor_parallel"),
        )
        set_device_mesh(self, mesh)
        self.stage_index = mesh["pipeline"].get_local_rank()
        assert module is not None
        self.parameter_order = [name for name, _ in module.named_parameters()]  # one device's, tied weights once
        self.tied = tied_parameter_names(module)
        self.stage_module = module.pipeline_stage(self.stage_index, self.stages)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        data_parallel = self.device_mesh["data_parallel"]  # the stages of one pipeline see the same samples
        return {"num_replicas": data_parallel.size(), "rank": data_parallel.get_local_rank()}

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        set_own_method(self.precision_plugin, "clip_grad_by_norm", self._clip_grad_by_norm)
        #: this stage's end of each tied weight (None between the ends), found once: the sharded parameters exist now
        self._tied_held = self._held_tied()
        assert self.stage_module is not None
        layers = getattr(self.stage_module, "layers", None)
        held = (
            len(layers()) if callable(layers) else None,
            sum(p.numel() for p in self.stage_module.parameters()),
        )
        self.stage_sizes: list[Any] = [None] * self.stages
        dist.all_gather_object(self.stage_sizes, held, group=self.pipeline_group)

    def pipeline_plan(self) -> dict[str, Any]:
        """The run plan's pipeline lines (``src/callbacks/run_plan.py``): the split and its idle share."""
        return {
            "pipeline_stages": self.stages,
            "micro_batches": self.micro_batches,
            "schedule": self.schedule_name,
            "layers_per_stage": [str(layers) for layers, _ in self.stage_sizes],
            "parameters_per_stage": [str(parameters) for _, parameters in self.stage_sizes],
            "bubble_fraction": f"{bubble_fraction(self.stages, self.micro_batches):.3f} (idle share of a step:"
            " (stages - 1) / (micro_batches + stages - 1))",
        }

    def teardown(self) -> None:
        drop_own_method(self.precision_plugin, "clip_grad_by_norm")
        self._schedule = None
        super().teardown()

    def _schedule_for(self, batch_size: int) -> Any:
        """The schedule of this stage, built at the first batch (``PipelineStage`` needs static shapes)."""
        if self._schedule is None:
            if batch_size % self.micro_batches:
                raise ConfigurationError(
                    f"a batch of {batch_size} samples per data-parallel rank does not split into"
                    f" --trainer.strategy.micro_batches={self.micro_batches} equal micro-batches. Fix: make"
                    " --data.batch_size / data_parallel_size a multiple of micro_batches."
                )
            from torch.distributed import pipelining  # every run imports this module (the registry); few use it

            stage = pipelining.PipelineStage(
                self.stage_module, self.stage_index, self.stages, self.root_device, group=self.pipeline_group
            )
            self._schedule = getattr(pipelining, SCHEDULES[self.schedule_name])(
                stage, self.micro_batches, loss_fn=self._micro_batch_loss, scale_grads=False
            )
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
        # the batch's mean loss, from the last stage to every stage: the model logs it as one device would
        loss = torch.zeros((), dtype=torch.float64, device=self.root_device)
        if self.is_last:
            loss += torch.stack([value.detach().double() for value in losses]).sum()
            loss *= self.lightning_module.trainer.accumulate_grad_batches
        dist.broadcast(loss, group=self.pipeline_group, group_src=self.stages - 1)
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
        """Sum this step's gradients of each tied weight over its two ends (the first and the last stage; the
        stages between add zeros), so that both copies take the step one device takes."""
        if self.stages == 1:
            return
        group, device = self.pipeline_group, self.root_device
        for parameter in self._tied_held:
            grad = new.get(parameter) if parameter is not None else None
            local = _local(grad) if grad is not None else None
            shape, dtype = _broadcast_header(local, group, src=self.stages - 1, device=device)
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

    def forward_through_stages(self, inputs: Tensor) -> Tensor:
        """The model's forward, stage after stage (no micro-batches: any batch size), its output on every stage."""
        group, previous, following = self.pipeline_group, self.stage_index - 1, self.stage_index + 1
        x = inputs if self.is_first else _receive(group, previous, self.root_device)
        x = self.stage_module(x)
        if not self.is_last:
            _send(x, group, following)
            x = None
        shape_and_dtype = _broadcast_header(x, group, src=self.stages - 1, device=self.root_device)
        output = (
            x if x is not None else torch.empty(shape_and_dtype[0], dtype=shape_and_dtype[1], device=self.root_device)
        )
        dist.broadcast(output, group=group, group_src=self.stages - 1)
        return output

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        checkpoint[CHECKPOINT_KEY] = {"stages": self.stages, "parameter_order": self.parameter_order}
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
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        from src.checkpoints.sharded import METADATA_FILE, is_sharded_checkpoint

        path = Path(self.broadcast(str(checkpoint_path)))
        if not is_sharded_checkpoint(path):
            raise ConfigurationError(
                f"--ckpt_path={path} is not a sharded pipeline checkpoint: a pipeline run resumes from the folder a"
                " pipeline run saved. Fix: pass that folder (e.g. runs/NAME/checkpoints/last.ckpt); to evaluate"
                " a single-file checkpoint, run validate/test/predict with another strategy."
            )
        metadata = torch.load(path / METADATA_FILE, weights_only=weights_only)
        saved = (metadata.get(CHECKPOINT_KEY) or {}).get("stages")
        if saved != self.stages:
            raise ConfigurationError(
                f"--ckpt_path={path} was saved by a run with {saved or 'no'} pipeline stages; this run has"
                f" {self.stages}. Fix: resume with {saved} stages (--trainer.devices x --trainer.num_nodes ="
                f" {saved} x --pipeline.data_parallel_size x tensor_parallel_size), or consolidate it (python -m"
                " src.consolidate) and evaluate or continue the file under another strategy."
            )
        model_state = {"state_dict": get_model_state_dict(self.model)}
        dcp.load(model_state, checkpoint_id=path)
        self.model.load_state_dict(model_state["state_dict"], strict=self.lightning_module.strict_loading)
        flat = StateDictOptions(flatten_optimizer_state_dict=True, cpu_offload=True)
        for index, optimizer in enumerate(self.optimizers):
            state = {f"optimizer_{index}": get_optimizer_state_dict(self.model, optimizer, options=flat)}
            dcp.load(state, checkpoint_id=path)
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=state[f"optimizer_{index}"], options=flat)
        return metadata

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
