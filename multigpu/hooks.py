"""What a model or a data module may implement for the engine: every hook the engine reads, in one place.

None is required: any ``LightningModule`` and ``LightningDataModule`` train as they are. Each hook below says which
feature reads it and what happens without it; this table and the Protocols below are the one place that says so
(``docs/engine.md`` points here). The engine reads a hook only through its Protocol and the names defined here
(``multigpu/hook_readers.py``), so that this list stays complete.

Each hook, where it goes, what reads it, and what happens without it:

- ``flops_per_batch`` or ``flops_per_sample`` (an attribute or a method), on the model: the throughput callback
  (TFLOP/s, ``perf/mfu``) and the model summary. Without: throughput in samples per second, no MFU.
- ``dp_modules``, on the model: ``--trainer.strategy=dp``, the children copied to every GPU each step. Without: every
  child but torchmetrics metrics is copied.
- ``pipeline_stage(index, count)``, ``pipeline_loss(output, target)``, ``model_step(batch)``, on the model:
  ``--trainer.strategy=pipeline``. Without: the pipeline is refused before launch, naming the missing methods.
- ``layers()``, on a module ``pipeline_stage`` returns: the run plan's layer count per stage. Without: the plan shows
  parameters only.
- ``check_datamodule(datamodule)``, on the model: the checks of the built objects, on every process before anything
  runs (raise ``ConfigurationError``). Without: the mismatch shows inside the first step.
- ``batch_size``, on the data module, else the model: ``python -m src.cli tune``. Without: ``tune`` is refused in one
  paragraph.

``src/models/gpt.py`` implements all of them but ``dp_modules``; docs/strategies.md says when each strategy needs what.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

#: the names the throughput callback and the model summary read (the first one a model has wins), as the Protocols
#: ``CountsFlopsPerBatch`` and ``CountsFlops`` declare them
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
class CountsFlopsPerBatch(Protocol):
    """A model whose training FLOPs per batch are known: the throughput callback logs TFLOP/s and MFU (``perf/mfu``)
    and the model summary shows the figure. An attribute or a method without arguments, read once when training
    starts: one micro-batch of one process, forward and backward. Wins over ``flops_per_sample``. Without either:
    throughput in samples per second only."""

    def flops_per_batch(self) -> float: ...


@runtime_checkable
class CountsFlops(Protocol):
    """A model whose training FLOPs per sample (forward and backward) are known; read as ``CountsFlopsPerBatch`` is,
    times the samples of a batch."""

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
