"""A rank slower than the others, named (docs/troubleshooting.md). Each rank times its own work with the host clock,
no device sync; backward is left out, as DDP's all-reduce in it makes every rank's step as long as the slowest's.
An interval's figures travel in an asynchronous gloo ``all_gather`` read at the next interval, so no step waits."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from multigpu.compat import logging_step
from multigpu.steps import EveryNSteps


@dataclass(frozen=True)
class Straggler:
    """The slowest rank of an interval, against the median of all ranks (seconds per step)."""

    rank: int
    own_s: float
    data_s: float
    median_own_s: float
    median_data_s: float

    @property
    def cause(self) -> str:
        return "data" if self.data_s - self.median_data_s > self.own_s - self.median_own_s else "compute"


def straggler_ratio(times: list[tuple[float, float]]) -> float:
    totals = [own + data for own, data in times]
    median = statistics.median(totals)
    return max(totals) / median if median > 0 else 1.0


def find_straggler(times: list[tuple[float, float]], factor: float, min_excess_s: float) -> Straggler | None:
    """The slowest rank where it takes ``factor`` times the median's time per step and ``min_excess_s`` more."""
    totals = [own + data for own, data in times]
    median = statistics.median(totals)
    slowest = max(range(len(totals)), key=totals.__getitem__)
    if totals[slowest] < factor * median or totals[slowest] - median < min_excess_s:
        return None
    own, data = times[slowest]
    return Straggler(slowest, own, data, statistics.median(t[0] for t in times), statistics.median(t[1] for t in times))


def describe_straggler(straggler: Straggler, steps: str) -> str:
    total = straggler.own_s + straggler.data_s
    median = straggler.median_own_s + straggler.median_data_s
    if straggler.cause == "data":
        why = (
            f"data: it waits {straggler.data_s:.3f} s per batch for the next one (or the work between steps),"
            f" the ranks' median {straggler.median_data_s:.3f} s: a slow disk or loader on its node, or too few"
            " --data.init_args.num_workers"
        )
    else:
        why = (
            f"compute: its training and optimizer steps take {straggler.own_s:.3f} s, the ranks' median"
            f" {straggler.median_own_s:.3f} s: work only it does, a slower or busier device or CPU"
        )
    return (
        f"straggler: rank {straggler.rank} takes {total:.3f} s per batch of its own (backward left out), the ranks'"
        f" median {median:.3f} s ({total / median if median else float('inf'):.1f}x) over steps {steps}; the other"
        f" ranks wait for it at every step. Slow part: {why}."
    )


class StragglerReport(Callback):
    """Names a rank that is slower than the median rank by ``factor``, every ``log_every_n_steps`` steps.

    Args:
        factor: A rank is named when its own time per step is at least this many times the median rank's.
        min_excess_s: ... and at least this many seconds more, so that tiny steps' noise names nobody.
    """

    def __init__(self, factor: float = 1.3, min_excess_s: float = 0.02) -> None:
        if factor <= 1:
            raise ValueError(f"--straggler.factor={factor} must be above 1 (the median rank itself is 1)")
        self.factor = factor
        self.min_excess_s = min_excess_s
        self._group: Any = None
        self._in_flight: tuple[list[torch.Tensor], Any, str] | None = None
        self._every = EveryNSteps()
        self._named: int | None = None
        self._reset(-1)

    def _reset(self, step: int) -> None:
        self._own = self._data = 0.0
        self._batches = 0
        self._first_step = step + 1
        self._gap_start: float | None = None
        self._mark: float | None = None  # when this rank's own work last started; None in backward

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.world_size > 1 and dist.is_initialized() and self._group is None:
            self._group = dist.new_group(backend="gloo")  # every rank, at the same point: a collective

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._every = EveryNSteps(trainer.log_every_n_steps, start=trainer.global_step)
        self._reset(trainer.global_step)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._gap_start = time.perf_counter()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._mark = time.perf_counter()
        if self._gap_start is not None:
            self._data += self._mark - self._gap_start

    def on_before_backward(self, *args: Any) -> None:
        if self._mark is not None:
            self._own += time.perf_counter() - self._mark
        self._mark = None

    def on_before_optimizer_step(self, *args: Any) -> None:
        self._mark = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        now = time.perf_counter()
        if self._mark is not None:  # None after the backward of a micro-batch that makes no optimizer step
            self._own += now - self._mark
        self._batches += 1
        self._gap_start = now
        if self._group is not None and self._every.due(trainer.global_step):
            self._exchange(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._gap_start = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.training:
            self._gap_start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._in_flight is not None:
            self._read(trainer)

    def _exchange(self, trainer: L.Trainer) -> None:
        if self._in_flight is not None:
            self._read(trainer)
        batches = max(self._batches, 1)
        mine = torch.tensor([self._own / batches, self._data / batches], dtype=torch.float64)
        gathered = [torch.zeros_like(mine) for _ in range(trainer.world_size)]
        work = dist.all_gather(gathered, mine, group=self._group, async_op=True)
        self._in_flight = (gathered, work, f"{self._first_step}-{trainer.global_step}")
        self._reset(trainer.global_step)

    def _read(self, trainer: L.Trainer) -> None:
        assert self._in_flight is not None
        gathered, work, steps = self._in_flight
        self._in_flight = None
        work.wait()
        if not trainer.is_global_zero:
            return
        times = [(float(t[0]), float(t[1])) for t in gathered]
        for logger in trainer.loggers:
            logger.log_metrics({"perf/straggler_ratio": straggler_ratio(times)}, step=logging_step(trainer))
        straggler = find_straggler(times, self.factor, self.min_excess_s)
        if straggler is not None and straggler.rank != self._named:
            print(describe_straggler(straggler, steps), file=sys.stderr, flush=True)
        self._named = straggler.rank if straggler is not None else None
