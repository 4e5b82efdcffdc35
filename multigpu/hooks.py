"""What a model or a data module may implement for the engine: every hook the engine reads, in one place.

None is required: any ``LightningModule`` and ``LightningDataModule`` train as they are. Each hook below says which
feature reads it and what happens without it. The engine's modules read a hook only through the names defined here
(``FLOPS_HOOKS``, ``DP_MODULES``, ...), so that this list stays complete; ``docs/engine.md`` has the same table.

| hook | on | read by | without it |
| --- | --- | --- | --- |
| ``flops_per_batch`` / ``flops_per_sample`` | model | throughput (TFLOP/s, MFU), model summary | no MFU |
| ``dp_modules`` | model | ``--trainer.strategy=dp`` | every child but metrics is copied to each GPU |
| ``pipeline_stage``, ``pipeline_loss``, ``model_step`` | model | ``--trainer.strategy=pipeline`` | pipeline refused |
| ``layers()`` | a pipeline stage | the run plan's stage sizes | the plan shows no layer count |
| ``check_datamodule(datamodule)`` | model | the checks of the built objects | no check of the pairing |
| ``batch_size`` | data module or model | ``python -m src.cli tune`` | tune refused |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

#: the names the throughput callback and the model summary read (the first one a model has wins)
FLOPS_HOOKS = ("flops_per_batch", "flops_per_sample")
#: the name ``dp`` reads: the children forward uses, which it copies to every GPU on each step
DP_MODULES = "dp_modules"
#: the three methods the pipeline strategy calls
PIPELINE_HOOKS = ("pipeline_stage", "pipeline_loss", "model_step")
#: the method of a pipeline stage that lists the blocks it runs
STAGE_LAYERS = "layers"
#: the method the checks of the built objects call with the data module
CHECK_DATAMODULE = "check_datamodule"
#: the argument ``tune`` searches (on the data module, else on the model)
BATCH_SIZE = "batch_size"


@runtime_checkable
class CountsFlops(Protocol):
    """A model whose training FLOPs are known: the throughput callback logs TFLOP/s and MFU (``perf/mfu``) and the
    model summary shows the figure. Either name, as an attribute or a method without arguments, read once when
    training starts; ``flops_per_batch`` is one micro-batch of one process, ``flops_per_sample`` one sample
    (forward and backward). Without it: throughput in samples per second only."""

    def flops_per_sample(self) -> float: ...


@runtime_checkable
class ReplicatesForDataParallel(Protocol):
    """A model that names the children its ``forward`` uses: ``--trainer.strategy=dp`` copies only those to every GPU
    on each step (leave out an EMA copy, a GAN's discriminator). Without it: every child but torchmetrics metrics.
    A name that is not a child is refused in one paragraph."""

    dp_modules: Sequence[str]


@runtime_checkable
class Pipelined(Protocol):
    """A model that ``--trainer.strategy=pipeline`` can split into stages over ranks. Without these three methods the
    strategy is refused before launch, naming the missing ones (``src/models/gpt.py`` has all three)."""

    def pipeline_stage(self, index: int, count: int) -> nn.Module:
        """The module that runs stage ``index`` of ``count``, built from the model's own layers (shared, not copied):
        from the previous stage's output (the batch's inputs on the first) to the next stage's input (the logits on
        the last). Every parameter must be in some stage."""
        ...

    def pipeline_loss(self, output: Tensor, target: Tensor) -> Tensor:
        """The mean loss of one micro-batch from the last stage's output."""
        ...

    def model_step(self, batch: Any) -> Any:
        """The loss of a batch, which ``training_step`` calls; under the pipeline it is answered from the stages."""
        ...


@runtime_checkable
class StageWithLayers(Protocol):
    """A pipeline stage that lists the blocks it runs: the run plan shows each stage's layer count."""

    def layers(self) -> Sequence[nn.Module]: ...


@runtime_checkable
class ChecksItsData(Protocol):
    """A model that refuses a data module it cannot train on, once both are built and before anything runs (on
    every process): raise ``multigpu.ConfigurationError`` with the option to change (the GPT example refuses
    sequences longer than its context). Without it: the mismatch shows as an error inside the first step."""

    def check_datamodule(self, datamodule: Any) -> None: ...


@runtime_checkable
class HasBatchSize(Protocol):
    """A data module (or model) with a ``batch_size`` argument that its loaders use: ``tune`` searches it. Without
    it: ``tune`` is refused in one paragraph."""

    batch_size: int


def module_flops(module: Any) -> tuple[str, float] | None:
    """(``flops_per_batch`` or ``flops_per_sample``, its value) of ``module``, or None if it declares neither."""
    for name in FLOPS_HOOKS:
        value = getattr(module, name, None)
        if callable(value):
            value = value()
        if value:
            return name, float(value)
    return None


def missing_pipeline_hooks(model: Any) -> list[str]:
    """The pipeline methods ``model`` lacks."""
    return [name for name in PIPELINE_HOOKS if not callable(getattr(model, name, None))]


def stage_layer_count(stage: Any) -> int | None:
    """How many blocks a pipeline stage runs, where it says (``layers()``)."""
    layers = getattr(stage, STAGE_LAYERS, None)
    return len(layers()) if callable(layers) else None


def check_datamodule(model: Any, datamodule: Any) -> None:
    """The model's own check of the data module it is paired with, where it has one."""
    check = getattr(model, CHECK_DATAMODULE, None)
    if callable(check) and datamodule is not None:
        check(datamodule)
