"""NVTX ranges for NVIDIA Nsight Systems: each training step and its phases (data wait, forward, backward, optimizer,
checkpoint copy) named on the timeline, beside the CUDA kernels they launch (``configs/debug/nsight.yaml``;
docs/best_practices.md, "Profile")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.cuda import nvtx

from multigpu.checkpoints.background import BackgroundCheckpointIO
from multigpu.errors import notice

DATA_WAIT = "data wait"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
CHECKPOINT_COPY = "checkpoint copy"


def on_cuda(trainer: L.Trainer) -> bool:
    """Whether this process trains on a CUDA device: NVTX marks nothing elsewhere."""
    return trainer.strategy.root_device.type == "cuda"


class NvtxRanges(Callback):
    """Marks each training batch (``step N``) and, in it, one phase at a time: ``forward`` from the batch's start
    (the user's ``training_step``), ``backward``, ``optimizer`` (from ``on_before_optimizer_step``, with clipping, to
    the end of ``optimizer.step``); ``data wait`` between batches (the next batch's fetch); ``checkpoint copy`` around
    the host copy of a checkpoint written in the background. Ranges, not pushes: phases do not nest in Lightning's
    hooks (the optimizer's closure runs the forward and backward inside ``optimizer.step``).

    Without CUDA it says so in one line and marks nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        #: the open ranges, by role ("step", "phase", data wait, checkpoint copy): name and NVTX id
        self._open: dict[str, tuple[str, int]] = {}
        self._manual = False
        self._in_epoch = False
        self._hooks: list[Any] = []

    def _start(self, role: str, name: str) -> None:
        self._end(role)
        self._open[role] = (name, nvtx.range_start(name))

    def _end(self, role: str) -> None:
        opened = self._open.pop(role, None)
        if opened is not None:
            nvtx.range_end(opened[1])

    def _end_all(self) -> None:
        for role in reversed(list(self._open)):
            self._end(role)

    @contextlib.contextmanager
    def _checkpoint_copy(self) -> Iterator[None]:
        self._start(CHECKPOINT_COPY, CHECKPOINT_COPY)
        try:
            yield
        finally:
            self._end(CHECKPOINT_COPY)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.active = on_cuda(trainer)
        if not self.active:
            if trainer.is_global_zero:
                notice(
                    f"NvtxRanges (configs/debug/nsight.yaml) marks NVTX ranges on CUDA devices only; this run trains on"
                    f" {trainer.strategy.root_device.type} and marks nothing"
                )
            return
        io = trainer.strategy.checkpoint_io
        if isinstance(io, BackgroundCheckpointIO):
            io.mark_copies(self._checkpoint_copy)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.active:
            return
        self._manual = not pl_module.automatic_optimization
        # torch's hook ends the optimizer's range where the step ends, which no Lightning hook marks
        self._hooks = [
            optimizer.register_step_post_hook(self._after_optimizer_step) for optimizer in trainer.optimizers
        ]

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._in_epoch = True
        self._waiting()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int) -> None:
        if not self.active:
            return
        self._end(DATA_WAIT)
        accumulate = trainer.accumulate_grad_batches
        micro = f", micro-batch {index % accumulate}" if accumulate > 1 else ""
        self._start("step", f"step {trainer.global_step}{micro}")
        self._start("phase", FORWARD)

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._phase(BACKWARD)

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # manual optimization: the training_step's own code goes on (the next network's forward)
        self._phase(FORWARD if self._manual else None)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        self._phase(OPTIMIZER)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._phase(FORWARD if self._manual else None)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not self.active:
            return
        self._end("phase")
        self._end("step")
        self._waiting()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end(DATA_WAIT)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._waiting()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._in_epoch = False
        self._end(DATA_WAIT)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end_all()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.on_train_end(trainer, pl_module)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        io = trainer.strategy.checkpoint_io
        if stage == "fit" and isinstance(io, BackgroundCheckpointIO):
            io.mark_copies()
        self.active = False

    def _phase(self, name: str | None) -> None:
        if not self.active or "step" not in self._open:
            return
        if name is None:
            self._end("phase")
        else:
            self._start("phase", name)

    def _waiting(self) -> None:
        if self.active and self._in_epoch:
            self._start(DATA_WAIT, DATA_WAIT)
