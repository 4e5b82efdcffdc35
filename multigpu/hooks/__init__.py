"""Every hook the engine reads from a model or data module, each as the Protocol it reads it through
(``hook_readers.py``). None is required: any ``LightningModule`` and ``LightningDataModule`` train as they are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

FLOPS_HOOKS = ("flops_per_batch", "flops_per_sample")
DP_MODULES = "dp_modules"
PIPELINE_HOOKS = ("pipeline_stage", "pipeline_loss", "model_step")
STAGE_LAYERS = "layers"
CHECK_DATAMODULE = "check_datamodule"
BATCH_SIZE = "batch_size"


@runtime_checkable
class CountsFlopsPerBatch(Protocol):
    """Training FLOPs of one micro-batch of one process (an attribute or a method): the throughput callback logs
    TFLOP/s and MFU, the model summary shows it. Without it or ``flops_per_sample``: samples per second only."""

    def flops_per_batch(self) -> float: ...


@runtime_checkable
class CountsFlops(Protocol):
    """Training FLOPs per sample, forward and backward; read as ``CountsFlopsPerBatch`` is, times the batch."""

    def flops_per_sample(self) -> float: ...


@runtime_checkable
class ReplicatesForDataParallel(Protocol):
    """The children ``forward`` uses, which ``dp`` copies to every GPU each step. Without it: all but metrics."""

    dp_modules: Sequence[str]


@runtime_checkable
class Pipelined(Protocol):
    """A model ``--trainer.strategy=pipeline`` splits into stages; without all three, the strategy is refused."""

    def pipeline_stage(self, index: int, count: int) -> nn.Module:
        """The module of stage ``index`` of ``count``, from the model's own layers (shared, not copied)."""
        ...

    def pipeline_loss(self, output: Tensor, target: Tensor) -> Tensor:
        """The mean loss of one micro-batch from the last stage's output."""
        ...

    def model_step(self, batch: Any) -> Any:
        """The loss of a batch, which ``training_step`` calls; the pipeline answers it from the stages."""
        ...


@runtime_checkable
class StageWithLayers(Protocol):
    """A pipeline stage that lists its blocks: the run plan shows each stage's layer count (else parameters only)."""

    def layers(self) -> Sequence[nn.Module]: ...


@runtime_checkable
class ChecksItsData(Protocol):
    """A model that refuses, with a ``ConfigurationError`` before anything runs, a data module it cannot train on.
    Without it: the mismatch shows inside the first step."""

    def check_datamodule(self, datamodule: Any) -> None: ...


@runtime_checkable
class HasBatchSize(Protocol):
    """A data module (else model) whose ``batch_size`` its loaders use: ``tune`` searches it, or is refused."""

    batch_size: int
