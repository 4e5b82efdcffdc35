"""``StepTimer``: the callback that times every optimizer step of a ``python -m src.cli fit`` run.

It only reads the clock at each step end (``benchmarks/clock.py``); the launcher (``benchmarks/runner.py``) adds
it with ``--trainer.callbacks+=benchmarks.timing.StepTimer --trainer.callbacks.path=FILE``. Under
``--trainer.strategy=pipeline`` it also times each stage's work against the pipelined part of the step (the
measured bubble), from the second step on: the stages are built by the first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.clock import StageClock, StepClock
from multigpu.compat import wrap_stage_work
from multigpu.strategies.model_parallel import memory_per_rank


def time_stage_work(stage: Any, start: Callable[[], None], end: Callable[[], None]) -> None:
    """Call ``start()`` before and ``end()`` after each piece of ``stage``'s own work, whichever schedule calls it
    (the measured bubble: ``benchmarks/clock.py``)."""

    def timed(work: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start()
            try:
                return work(*args, **kwargs)
            finally:
                end()

        return run

    wrap_stage_work(stage, timed)


class StepTimer(Callback):
    """Times every optimizer step of a ``python -m src.cli fit`` run; each rank writes ``rank_path(path, rank)``.

    Add it on the command line: ``--trainer.callbacks+=benchmarks.timing.StepTimer
    --trainer.callbacks.path=out.json``. The launcher sets ``BENCH_T0`` for the time to first step.

    Args:
        path: JSON file of rank 0; other ranks write beside it.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.clock: StepClock | None = None
        self.stage_clock: StageClock | None = None
        self._timed_stages = False
        self._last_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock = StepClock(pl_module.device)
        if hasattr(trainer.strategy, "pipeline_stages"):  # multigpu/strategies/pipeline/strategy.py
            self.stage_clock = StageClock(pl_module.device)
        self._last_step = trainer.global_step

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        clock = self.stage_clock
        if clock is None:
            return
        if not self._timed_stages and trainer.strategy.pipeline_stages:  # built by the first training batch
            for stage in trainer.strategy.pipeline_stages:
                time_stage_work(stage, clock.work_start, clock.work_end)
            self._timed_stages = True
        if self._timed_stages:
            clock.window_start()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if self.stage_clock is not None:
            self.stage_clock.window_end()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._last_step or self.clock is None:
            return  # mid-accumulation: no optimizer step finished
        self._last_step = trainer.global_step
        clock = self.clock
        clock.step_end(new_epoch=batch_idx + 1 == trainer.accumulate_grad_batches)
        if self.stage_clock is not None:
            self.stage_clock.step_end()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and (clock.steps == 1 or trainer.global_step == trainer.max_steps):
            clock.record_loss("first" if clock.steps == 1 else "last", loss)  # after the clock read: not timed

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.clock is None:
            return
        self.clock.write(
            self.path,
            trainer.global_rank,
            world_size=trainer.world_size,
            strategy=type(trainer.strategy).__name__,
            precision=str(trainer.precision),
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            # after the last step: Adam's moments exist, and under fsdp2 / tensor_parallel only this rank's shards
            state_bytes=memory_per_rank(pl_module, trainer.optimizers),
            **(
                {**self.stage_clock.result(), "pipeline_stage": trainer.strategy.pipeline_rank}
                if self.stage_clock is not None
                else {}
            ),
        )
