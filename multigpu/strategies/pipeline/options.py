"""The settings of ``--trainer.strategy=pipeline``, their checks before launch, and the idle share of a split."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from multigpu.errors import ConfigurationError
from multigpu.hooks.readers import missing_pipeline_hooks

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B"}
MULTI_STAGE = ("interleaved_1f1b",)


def bubble_fraction(ranks: int, micro_batches: int, stages_per_rank: int = 1) -> float:
    """The share of a step each process idles while the pipeline fills and drains (for ``micro_batches >= ranks``)."""
    return (ranks - 1) / (stages_per_rank * micro_batches + ranks - 1)


def split_plan(options: PipelineOptions, ranks: int, stage_sizes: list[tuple[Any, int]]) -> dict[str, Any]:
    """The run plan's pipeline lines of a split whose stages hold ``stage_sizes`` (layers, parameters)."""
    per_rank, count = options.stages_per_rank, ranks * options.stages_per_rank
    formula = "(ranks - 1) / (" + ("micro_batches" if per_rank == 1 else "stages_per_rank x micro_batches")
    formula += " + ranks - 1)"
    return {
        "pipeline_stages": count if per_rank == 1 else f"{count} ({per_rank} per rank)",
        "micro_batches": options.micro_batches,
        "schedule": options.schedule,
        "layers_per_stage": [str(layers) for layers, _ in stage_sizes],
        "parameters_per_stage": [str(parameters) for _, parameters in stage_sizes],
        "bubble_fraction": f"{bubble_fraction(ranks, options.micro_batches, per_rank):.3f} (idle share of a"
        f" step: {formula})",
    }


def fits_rounds(micro_batches: int, ranks: int) -> bool:
    # ScheduleInterleaved1F1B runs them in max(1, m // ranks) rounds of equal size
    return micro_batches >= 1 and micro_batches % max(1, micro_batches // ranks) == 0


def pipeline_refusal(model_name: str, missing: list[str]) -> ConfigurationError:
    return ConfigurationError(
        f"--trainer.strategy=pipeline needs the model to say how its layers split into stages: {model_name} has no"
        f" {', '.join(missing)}. Fix: add pipeline_stage(index, count) (return the module that runs stage `index`,"
        " built from the model's own layers), pipeline_loss(output, target) and model_step(batch) (multigpu.hooks),"
        " or use --trainer.strategy=fsdp2, which"
        " shards any model without code."
    )


@dataclass
class PipelineOptions:
    """``--pipeline.*``: the settings of ``--trainer.strategy=pipeline``.

    Args:
        micro_batches: Micro-batches per batch, at least one per pipeline rank (more shrink the idle share).
        schedule: ``1f1b``, ``gpipe``, or with ``stages_per_rank`` >= 2, ``interleaved_1f1b``.
        stages_per_rank: Stages each process of a pipeline runs: 1, or 2 or more for ``interleaved_1f1b``.
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
    """Refuse before launch, in one paragraph, a split that would fail or hang in every process."""
    missing = missing_pipeline_hooks(model_class) if model_class is not None else []
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
    """Build every stage once before launch (a stage shares the model's layers) and refuse a split that would fail."""
    names = [name for name, _ in model.named_parameters()]
    stages = [model.pipeline_stage(index, count) for index in range(count)]
    kind = type(model).__name__
    if [name for name, _ in model.named_parameters()] != names:
        raise ConfigurationError(
            f"{kind}.pipeline_stage changed the model (its parameters are not the ones it had): the strategy calls"
            " it for every stage a process holds, and removes the other stages' layers itself. Fix: build the"
            " stage's module from the model's layers without deleting or replacing any (the engine's docs/models.md,"
            ' "Layers on different devices: pipeline").'
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
