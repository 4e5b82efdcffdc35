"""The run plan: what a training run is about to do, printed once by rank 0 and saved as ``run_plan.json``, so
a wrong batch, precision or checkpoint shows before the first step; at the first step, the seconds it took to get
there, in parts (``multigpu/observe/first_step.py``)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import CombinedLoader
from torch import nn

from multigpu.data.libraries import self_sharded_meaning, shards_itself
from multigpu.data.topology import data_parallel_world
from multigpu.observe import first_step
from multigpu.strategies.model_parallel import memory_per_rank

PLAN_FILE = "run_plan.json"
SAME_ORDER = "the same at any number of processes (the engine's global order)"
ORDER_DEPENDS = "depends on the number of processes"

#: listed, as their common base class is private
BATCH_NORMS = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.LazyBatchNorm1d,
    nn.LazyBatchNorm2d,
    nn.LazyBatchNorm3d,
    nn.SyncBatchNorm,
)


def batch_norm_layers(module: nn.Module) -> list[str]:
    return [name for name, child in module.named_modules() if isinstance(child, BATCH_NORMS)]


def _count(value: float | int) -> int | str:
    return "unbounded" if value is None or (isinstance(value, float) and math.isinf(value)) else int(value)


def _validation(trainer: L.Trainer) -> str:
    if not trainer.enable_validation:
        return "none"
    batches = trainer.num_val_batches
    per_run = ", ".join(str(_count(n)) for n in batches) if batches else "?"
    within_epoch = trainer.val_check_batch is not None and trainer.val_check_batch < trainer.num_training_batches
    if trainer.check_val_every_n_epoch is None or within_epoch:
        when = f"every {trainer.val_check_batch} training batches"
    else:
        when = f"every {trainer.check_val_every_n_epoch} epoch(s)"
    return f"{when}, {per_run} batches each"


def batch_norm_note(trainer: L.Trainer, pl_module: L.LightningModule, micro: int | None) -> str | None:
    """What the model's BatchNorm layers normalise over, and whether that is what one device would."""
    layers = batch_norm_layers(pl_module)
    if not layers:
        return None
    count = f"{len(layers)} BatchNorm layer(s)"
    processes = trainer.world_size
    strategy = trainer.strategy
    if getattr(strategy, "parallel_forward_active", False):  # the template's dp, splitting over several GPUs
        gpus = len(strategy.parallel_devices or [])
        chunk = f"about {math.ceil(micro / gpus)} of {micro} samples" if micro else f"1/{gpus} of the batch"
        return (
            f"{count} normalise each GPU's chunk of the batch ({chunk}) and only the first GPU's chunk updates the"
            " running statistics, so dp does not train the model one device does; --trainer.sync_batchnorm does not"
            " apply under dp (one process). Fix: --trainer.strategy=ddp --trainer.sync_batchnorm=true"
        )
    if processes > 1 and any(isinstance(module, nn.SyncBatchNorm) for module in pl_module.modules()):
        return f"{count}, synchronised over the {processes} processes (--trainer.sync_batchnorm=true), as on one device"
    if processes > 1:
        share = f"micro-batch of {micro} samples, not the {micro * processes} one device normalises" if micro else ""
        share = share or "part of the batch"
        cpu = " (it needs GPUs; on CPU processes train with --trainer.devices=1 for the one-device model)"
        return (
            f"{count} normalise each process's {share}: per-process statistics, so this run does not train the same"
            " model as one device. Fix: --trainer.sync_batchnorm=true"
            + (cpu if strategy.root_device.type == "cpu" else "")
        )
    return f"{count}, statistics over each batch of {micro} samples, as on one device" if micro else count


def engine_meaning(loader: Any) -> str | None:
    for owner in (getattr(loader, "sampler", None), getattr(loader, "dataset", None)):
        meaning = getattr(owner, "meaning", None)
        if isinstance(meaning, str):
            return meaning
    return None


def batch_meaning(loader: Any) -> str:
    own = self_sharded_meaning(loader) or engine_meaning(loader)
    return own or "per process (Lightning's meaning: the engine does not sample this loader)"


def data_order(loader: Any) -> str:
    library = shards_itself(loader)
    if library:
        return f"{ORDER_DEPENDS}: {library} stripes its samples among the processes"
    if engine_meaning(loader) is not None:
        return SAME_ORDER
    return (
        f"{ORDER_DEPENDS}: the engine does not sample this loader (Lightning's DistributedSampler, or the loader's own"
        " sampler or sharding, splits it among the processes)"
    )


def per_loader(loaders: Any, fact: Any) -> str | list[str] | None:
    if loaders is None:
        return None
    flattened = loaders.flattened if isinstance(loaders, CombinedLoader) else CombinedLoader(loaders).flattened
    if len(flattened) == 1:
        return fact(flattened[0])
    return [f"loader {index}: {fact(loader)}" for index, loader in enumerate(flattened)]


def run_plan(trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
    """The facts of a fit that is about to start, once its data loaders are built."""
    loader = trainer.train_dataloader
    sizes = [getattr(owner, "batch_size", None) for owner in (loader, getattr(loader, "batch_sampler", None))]
    micro = next((size for size in sizes if isinstance(size, int)), None)
    accumulate = trainer.accumulate_grad_batches
    batches_per_epoch = trainer.num_training_batches
    steps_per_epoch = (
        math.ceil(batches_per_epoch / accumulate) if not math.isinf(batches_per_epoch) else batches_per_epoch
    )
    datamodule = getattr(trainer, "datamodule", None)
    # the ranks of one tensor-parallel group share a micro-batch
    data_parallel = data_parallel_world(trainer.strategy)
    replicas = data_parallel[0] if data_parallel else trainer.world_size
    return {
        "model": f"{type(pl_module).__module__}.{type(pl_module).__qualname__}",
        "data": f"{type(datamodule).__module__}.{type(datamodule).__qualname__}" if datamodule else None,
        "accelerator": type(trainer.accelerator).__name__,
        "strategy": type(trainer.strategy).__name__,
        "nodes": trainer.num_nodes,
        "devices_per_node": trainer.num_devices,
        "world_size": trainer.world_size,
        "precision": str(trainer.precision),
        "global_batch": micro * accumulate * replicas if micro else None,
        "batch_size_means": per_loader(loader, batch_meaning),
        "data_order": per_loader(loader, data_order),
        "micro_batch_per_process": micro,
        "accumulate_grad_batches": accumulate,
        "steps_per_epoch": _count(steps_per_epoch),
        "total_steps": _count(trainer.estimated_stepping_batches),
        "max_epochs": trainer.max_epochs,
        "max_steps": trainer.max_steps,
        "validation": _validation(trainer),
        "batch_norm": batch_norm_note(trainer, pl_module, micro),
        "log_every_n_steps": trainer.log_every_n_steps,
        "run_dir": os.path.abspath(trainer.default_root_dir),
        "loggers": [f"{type(logger).__name__}: {logger.log_dir or logger.save_dir}" for logger in trainer.loggers],
        "resumes_from": str(trainer.ckpt_path) if trainer.ckpt_path else None,
        "seed": int(os.environ["PL_GLOBAL_SEED"]) if "PL_GLOBAL_SEED" in os.environ else None,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        **{f"{name}_bytes_per_rank": value for name, value in memory_per_rank(pl_module, trainer.optimizers).items()},
        **(trainer.strategy.pipeline_plan() if hasattr(trainer.strategy, "pipeline_plan") else {}),
    }


def format_plan(plan: dict[str, Any]) -> str:
    width = max(len(key) for key in plan)
    rows = []
    for key, value in plan.items():
        shown = ", ".join(value) if isinstance(value, list) else ("-" if value is None else value)
        rows.append(f"  {key.ljust(width)}  {shown}")
    return "Run plan\n" + "\n".join(rows)


class RunPlan(Callback):
    """Prints the run plan when training starts, on rank 0, and writes it into this start's log directory; at the
    end of the first training step, one line of the seconds since the process started, in parts, also written into
    the plan (``first_step_s``).

    Args:
        print_plan: Print the table and the line (the JSON file is written either way).
    """

    def __init__(self, print_plan: bool = True) -> None:
        super().__init__()
        self.print_plan = print_plan
        self.plan: dict[str, Any] | None = None
        self._folder: Path | None = None
        self._marks: list[tuple[str, float]] = []
        self._started: float | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._marks = first_step.taken()  # the command line's; without it, the parts start at this fit
        self._started = first_step.process_started() if self._marks else None
        self._marks = self._marks or [("fit", time.perf_counter())]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark("setup")

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark("sanity check")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # every rank: `trainer.log_dir` is a broadcast under ddp, so calling it on rank 0 alone would hang
        self.plan = run_plan(trainer, pl_module)
        self._folder = Path(trainer.log_dir or trainer.default_root_dir)
        if not trainer.is_global_zero:
            return
        if self.print_plan:
            print(format_plan(self.plan), flush=True)
        self._write(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._mark("first batch")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._marks and trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)  # once: the step's kernels are part of its time
        if not self._mark("first step"):
            return
        parts = first_step.split(self._marks, self._started)
        self._marks = []
        if self.plan is None or not trainer.is_global_zero:
            return
        self.plan["first_step_s"] = parts
        if self.print_plan:
            print(first_step.line(parts), flush=True)
        self._write(trainer)

    def _mark(self, part: str) -> bool:
        """End ``part`` now, the first time only, while the first step is being timed."""
        if not self._marks or part in dict(self._marks):
            return False
        self._marks.append((part, time.perf_counter()))
        return True

    def _write(self, trainer: L.Trainer) -> None:
        if not trainer.fast_dev_run and self._folder is not None:
            self._folder.mkdir(parents=True, exist_ok=True)
            (self._folder / PLAN_FILE).write_text(json.dumps(self.plan, indent=2) + "\n")
