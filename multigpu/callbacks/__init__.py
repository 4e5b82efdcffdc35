"""The callbacks the engine adds to a run, in the order the Trainer holds them (the order Lightning calls them at each
hook): ``run_callbacks``. docs/engine.md ("What runs around your training step") tells the hooks each runs at."""

from __future__ import annotations

from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback, ModelSummary, ProgressBar, Timer
from lightning.pytorch.strategies import ModelParallelStrategy

from multigpu.callbacks.checkpoint import RunCheckpoint
from multigpu.callbacks.compile import CompileModel
from multigpu.callbacks.continuation import ExactContinuation, RunTimer
from multigpu.callbacks.loaders import EngineLoaders
from multigpu.callbacks.nan_guard import NonFiniteLoss, NonFiniteLossGuard
from multigpu.callbacks.precision import Float64Metrics, PrecisionBeforeRestore
from multigpu.callbacks.preemption import PreemptionCheckpoint
from multigpu.callbacks.progress import PlainProgressBar, progress_bar
from multigpu.callbacks.random_state import RandomState
from multigpu.callbacks.ranks import DestroyProcessGroupAtExit, StopOtherRanksOnError, UnshareSpawnedTensors
from multigpu.callbacks.run_plan import RunPlan
from multigpu.callbacks.stack_dumps import StackDumps
from multigpu.callbacks.straggler import StragglerReport
from multigpu.callbacks.summary import ModelSummary as FlopsAwareModelSummary
from multigpu.callbacks.throughput import SpeedMonitor
from multigpu.strategies import FSDP2Strategy, TensorParallelStrategy
from multigpu.strategies.model_parallel import ClipAcrossMeshes

#: the names ``--callbacks_off`` accepts
OPTIONAL_CALLBACKS = (
    "progress_bar",
    "model_summary",
    "preemption",
    "throughput",
    "straggler",
    "run_plan",
    "nan_guard",
    "checkpoint",
)

#: the callbacks with options (``--checkpoint.*``, ...), which the parser builds (``multigpu/parser.py``)
CALLBACK_OPTIONS = {
    "preemption": PreemptionCheckpoint,
    "throughput": SpeedMonitor,
    "straggler": StragglerReport,
    "run_plan": RunPlan,
    "nan_guard": NonFiniteLossGuard,
    "checkpoint": RunCheckpoint,
}


def run_callbacks(options: Namespace, built: Namespace) -> tuple[list[Callback], dict[str, Any], set[str]]:
    """The run's callbacks in order, the Trainer switches that go with them, and the names left out.

    ``options``: the parsed options; ``built``: the objects built from them (``trainer.callbacks``, the callbacks
    with options). Lightning then appends LightningCLI's ``SaveConfigCallback`` and moves ``ModelCheckpoint`` last.
    """
    trainer = built.get("trainer") or {}
    off = set(options.get("callbacks_off") or [])
    yours = trainer.get("callbacks") or []
    yours = list(yours) if isinstance(yours, list) else [yours]
    switches: dict[str, Any] = {}

    bar = None if "progress_bar" in off else progress_bar(options.get("progress_bar", "auto"))
    if trainer.get("enable_progress_bar") is False or any(isinstance(c, ProgressBar) for c in yours):
        bar = None  # none, or yours
    elif bar is None:
        switches["enable_progress_bar"] = False
    summary = None
    summarises = trainer.get("enable_model_summary") is not False and not trainer.get("barebones")
    if "model_summary" in off:
        switches["enable_model_summary"] = False
    elif summarises and not any(isinstance(c, ModelSummary) for c in yours):
        summary = FlopsAwareModelSummary()
        switches["enable_model_summary"] = False  # Lightning's own is replaced (else it logs that it skips it)
    timer = None
    if trainer.get("max_time") is not None and not any(isinstance(c, Timer) for c in yours):
        timer = RunTimer(duration=trainer.get("max_time"))
        switches["max_time"] = None
    if trainer.get("enable_checkpointing") is False:
        off.add("checkpoint")  # the Trainer refuses a ModelCheckpoint when checkpointing is off
    elif "checkpoint" in off:
        switches["enable_checkpointing"] = False  # else Lightning adds a ModelCheckpoint of its own
    strategy = trainer.get("strategy")  # built, where given as a class_path
    # Lightning's own ModelParallelStrategy clips with torch's clipping, which does not reduce across meshes
    clip_across_meshes = isinstance(strategy, ModelParallelStrategy) and not isinstance(
        strategy, (FSDP2Strategy, TensorParallelStrategy)
    )

    def engine(name: str) -> Callback | None:
        return None if name in off else built.get(name)

    callbacks = [
        *yours,  # --trainer.callbacks run first at every hook
        engine("throughput"),  # perf/* figures; before the bar, which shows the interval it measured
        bar,  # a plain line every 50 steps and after each validation, or Rich
        summary,  # the parameter table at fit start, FLOPs only where known
        CompileModel() if options.get("compile") else None,  # --compile=true: forward compiled at setup
        ClipAcrossMeshes() if clip_across_meshes else None,  # gradient clipping across device meshes
        EngineLoaders(per_process=bool(options.get("batch_size_per_process"))),  # the engine's sampling
        ExactContinuation(),  # a stop saved as the position it is: --ckpt_path=last continues exactly
        RandomState(),  # every rank's generators saved and restored: dropout draws as if uninterrupted
        timer,  # --trainer.max_time, stopping at a step boundary
        engine("preemption"),  # a stop signal: save last.ckpt, stop, requeue
        engine("straggler"),  # names a rank slower than the median
        engine("run_plan"),  # prints and saves run_plan.json when training starts
        engine("nan_guard"),  # stops at a non-finite loss, before a checkpoint is written
        engine("checkpoint"),  # best-<step>.ckpt and last.ckpt
        PrecisionBeforeRestore(),  # a "-true" precision: the module converted before a checkpoint loads into it
        Float64Metrics(),  # 64-true: torchmetrics states in float64
        StackDumps(),  # before StopOtherRanksOnError: the other ranks' stacks are taken before they are killed
        StopOtherRanksOnError(),  # an error on one rank stops the others
        UnshareSpawnedTensors(),  # private metric states in ddp_spawn workers
        DestroyProcessGroupAtExit(),  # else gloo may abort a finished rank
    ]
    return [callback for callback in callbacks if callback is not None], switches, off


__all__ = [
    "CALLBACK_OPTIONS",
    "OPTIONAL_CALLBACKS",
    "NonFiniteLoss",
    "NonFiniteLossGuard",
    "PlainProgressBar",
    "PreemptionCheckpoint",
    "RunCheckpoint",
    "RunPlan",
    "SpeedMonitor",
    "StackDumps",
    "StragglerReport",
    "progress_bar",
    "run_callbacks",
]
