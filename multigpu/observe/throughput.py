"""Throughput, TFLOP/s, MFU, peak memory and the data-wait share of every run (docs/engine.md). Lightning's
``ThroughputMonitor`` syncs after every batch and its table holds sparse peaks, twice the dense ones."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from multigpu.compat import available_flops, logging_step
from multigpu.data.topology import data_parallel_world
from multigpu.hooks.readers import module_flops
from multigpu.steps import EveryNSteps
from multigpu.strategies.model_parallel import memory_per_rank

#: dense (not sparse) tensor-core peaks of one device, TFLOP/s, from the vendors' datasheets; the first entry whose
#: name pattern the device's name contains wins ("h200"/"h100" alone are the SXM parts, e.g. "H100 80GB HBM3")
DENSE_PEAK_TFLOPS: list[tuple[tuple[str, ...], dict[str, float]]] = [
    (("h200 nvl", "h100 nvl"), {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (("h100 pcie",), {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    (("h200", "h100"), {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("a100",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("l40s",), {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    (("l4",), {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (("v100",), {"fp16": 125.0, "fp32": 15.7}),
]


def compute_kind(precision: str) -> str:
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    if precision.startswith("64"):
        return "fp64"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def dense_peak_flops(device: torch.device, precision: str) -> float | None:
    """Dense peak FLOP/s of one device at this precision, or None where unknown (any CPU, an unlisted GPU)."""
    if device.type != "cuda":
        return None
    kind = compute_kind(precision)
    name = torch.cuda.get_device_name(device).lower()
    for patterns, peaks in DENSE_PEAK_TFLOPS:
        if any(pattern in name for pattern in patterns):
            return peaks[kind] * 1e12 if kind in peaks else None
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": "tfloat32", "fp32": torch.float32}
    return available_flops(device, dtypes.get(kind, torch.float64))


def first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        for item in batch:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def peak_memory(device: torch.device) -> dict[str, float]:
    """Peak memory so far, GB: allocated and reserved by PyTorch on a GPU, or the process's resident set."""
    if device.type == "cuda":
        return {
            "perf/memory_allocated_gb": torch.cuda.max_memory_allocated(device) / 1e9,
            "perf/memory_reserved_gb": torch.cuda.max_memory_reserved(device) / 1e9,
        }
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"perf/memory_rss_gb": max_rss * (1 if sys.platform == "darwin" else 1024) / 1e9}


def shown_figures(trainer: L.Trainer) -> dict[str, float]:
    figures: dict[str, float] = {}
    for callback in trainer.callbacks:
        if isinstance(callback, SpeedMonitor):
            figures.update(callback.shown)
    return figures


class SpeedMonitor(Callback):
    """Logs samples/s (and tokens/s), TFLOP/s, MFU, peak memory and the share of time spent waiting for data.

    Figures cover the steps since the last log, validation excluded; they go to the loggers only, not
    ``trainer.callback_metrics``, so no callback can monitor them.

    Args:
        peak_tflops: Dense peak of one device at the run's precision, TFLOP/s; overrides the built-in table. Give
            it for an unlisted GPU, or for a CPU to get an MFU there.
        count: What a sample is for ``tokens_per_s``: ``auto`` counts tokens when the batch's first tensor is
            integer ids of shape ``(N, T)``; ``samples`` never counts tokens; ``tokens`` always does (``numel``).
        prog_bar: Show the main figures in the progress output.
    """

    def __init__(
        self,
        peak_tflops: float | None = None,
        count: Literal["auto", "samples", "tokens"] = "auto",
        prog_bar: bool = True,
    ) -> None:
        super().__init__()
        self.peak_tflops = peak_tflops
        self.count = count
        self.prog_bar = prog_bar
        self._peak_flops: float | None = None
        self._flops: tuple[str, float] | None = None
        self._devices_per_process = 1
        self._reset_interval()
        self._gap_start: float | None = None
        self._batch_start = 0.0
        self._every = EveryNSteps()
        #: what the progress output shows
        self.shown: dict[str, float] = {}

    def _reset_interval(self) -> None:
        self._samples = 0
        self._tokens = 0
        self._batches = 0
        self._busy = 0.0
        self._wait = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._devices_per_process = trainer.num_devices if trainer.world_size == 1 else 1
        self._flops = module_flops(pl_module)
        if self.peak_tflops is not None:
            self._peak_flops = self.peak_tflops * 1e12
        else:
            self._peak_flops = dense_peak_flops(trainer.strategy.root_device, str(trainer.precision))
            if self._peak_flops is None and trainer.strategy.root_device.type == "cuda":
                rank_zero_warn(
                    f"No dense peak FLOP/s known for {torch.cuda.get_device_name(trainer.strategy.root_device)}"
                    f" at precision {trainer.precision}, so no MFU is logged. Fix: --throughput.peak_tflops=<dense"
                    " TFLOP/s of one device from its datasheet>."
                )
        self._reset_interval()
        self._every = EveryNSteps(trainer.log_every_n_steps, start=trainer.global_step)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._gap_start = time.perf_counter()  # creating the loader's iterator (worker start-up) is waiting too

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_start = time.perf_counter()
        if self._gap_start is not None:
            self._wait += self._batch_start - self._gap_start

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        tensor = first_tensor(batch)
        if tensor is not None:
            self._samples += tensor.shape[0] if tensor.ndim else 1
            is_ids = tensor.ndim == 2 and not tensor.is_floating_point() and not tensor.is_complex()
            if self.count == "tokens" or (self.count == "auto" and is_ids):
                self._tokens += tensor.numel()
        self._batches += 1
        if self._every.due(trainer.global_step):
            self._log(trainer, pl_module)
        self._gap_start = time.perf_counter()
        self._busy += self._gap_start - self._batch_start

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._gap_start = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.training:
            self._gap_start = time.perf_counter()

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.strategy.root_device.type == "cuda":
            # once per interval, on a step whose logging syncs anyway: the interval's time is then exact
            torch.cuda.synchronize(trainer.strategy.root_device)
        now = time.perf_counter()
        elapsed = self._busy + (now - self._batch_start) + self._wait
        if elapsed <= 0 or self._batches == 0:
            return
        # a tensor-parallel group's ranks load the same batch: counted once per data-parallel replica
        data_parallel = data_parallel_world(trainer.strategy)
        processes = data_parallel[0] if data_parallel else trainer.world_size
        devices = trainer.world_size * self._devices_per_process
        metrics = {
            "perf/samples_per_s": self._samples * processes / elapsed,
            "perf/samples_per_s_per_device": self._samples * processes / elapsed / devices,
        }
        if self._tokens:
            metrics["perf/tokens_per_s"] = self._tokens * processes / elapsed
            metrics["perf/tokens_per_s_per_device"] = self._tokens * processes / elapsed / devices
        if self._flops is not None:
            name, value = self._flops
            # the whole model's FLOPs of this process's batches, shared by the ranks of its tensor-parallel group
            flops = value * (self._batches if name == "flops_per_batch" else self._samples)
            flops *= processes / trainer.world_size
            flops_per_device = flops / elapsed / self._devices_per_process
            metrics["perf/tflops_per_device"] = flops_per_device / 1e12
            if self._peak_flops:
                metrics["perf/mfu"] = flops_per_device / self._peak_flops
        metrics.update(peak_memory(trainer.strategy.root_device))
        held = memory_per_rank(pl_module, trainer.optimizers)
        metrics.update({f"perf/{name}_bytes_per_rank": float(value) for name, value in held.items()})
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None and scaler.is_enabled():
            # a falling scale means steps the scaler skipped on overflow; reading it syncs, as logging does anyway
            metrics["perf/grad_scale"] = float(scaler.get_scale())
        metrics["perf/data_wait"] = self._wait / elapsed
        shown = {"perf/tokens_per_s" if self._tokens else "perf/samples_per_s", "perf/mfu", "perf/tflops_per_device"}
        shown |= {"perf/data_wait", "perf/memory_allocated_gb", "perf/memory_rss_gb"}
        self.shown = {name: value for name, value in metrics.items() if name in shown} if self.prog_bar else {}
        # straight to the loggers: `self.log` costs ~0.25 ms per value, for figures that need no reduction
        step = logging_step(trainer)  # the step of the loss rows logged with them (W&B drops steps going back)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        self._reset_interval()
        self._batch_start = now
