"""Every callback the template adds to a run, in the order the Trainer holds them (the order Lightning calls
them at each hook).

``template_callbacks`` below builds the one list before the Trainer (``multigpu/trainer_arguments.py``):
your own ``--trainer.callbacks`` first, then these; Lightning moves ``ModelCheckpoint`` to the end, after LightningCLI's
``SaveConfigCallback``, and nothing is added once the Trainer is built. Leave an optional one out with
``--callbacks_off=[name, ...]`` (or ``callbacks_off:`` in a config); the always-on ones make a run correct and do
nothing where they do not apply. docs/engine.md ("What runs around your training step") tells the hooks each runs at.

- ``progress_bar``: ``PlainProgressBar`` or Rich (progress.py): a line every 50 steps and after each validation.
- ``model_summary``: ``ModelSummary`` (summary.py): the parameter table at fit start, FLOPs only where known.
- ``CompileModel`` (compile.py), on with ``--compile=true``: compiles the model's ``forward`` at setup.
- ``ClipAcrossMeshes`` (multigpu/strategies/model_parallel.py), with a ``ModelParallelStrategy`` given as a class other
  than the template's (Lightning's own): gradient clipping across device meshes, as fsdp2 and tensor_parallel clip.
- ``EngineLoaders`` (loaders.py), always, acting unless ``--trainer.use_distributed_sampler=false``: the engine's
  sampling in the training loaders a data module or model returns (the same global order at any world size, samples
  seeded one by one, an exact resume mid-epoch), a loader's ``batch_size`` the global batch of one optimizer step
  (``--batch_size_per_process=true``: Lightning's per-process meaning).
- ``ExactContinuation`` (continuation.py), always: saves a stop as the position it is, so that
  ``--ckpt_path=last`` with larger limits continues exactly.
- ``RandomState`` (random_state.py), always: every rank's random-number generators in every checkpoint, each
  rank's own restored when a fit resumes (dropout draws what an uninterrupted run draws).
- ``RunTimer`` (continuation.py), with ``--trainer.max_time``: that limit, stopping at a step boundary.
- ``preemption``: ``PreemptionCheckpoint`` (preemption.py): on a stop signal, save ``last.ckpt``, stop, requeue
  (off: Lightning's own handlers, which save inside the signal handler).
- ``throughput``: ``SpeedMonitor`` (throughput.py): ``perf/*`` (samples/s, MFU, memory, data wait).
- ``straggler``: ``StragglerReport`` (straggler.py), acting where a process group exists: every
  ``log_every_n_steps`` the ranks exchange their own time per batch; rank 0 names a rank slower than the median
  by ``--straggler.factor`` and logs ``perf/straggler_ratio``.
- ``run_plan``: ``RunPlan`` (run_plan.py): prints and saves ``run_plan.json`` when training starts.
- ``nan_guard``: ``NonFiniteLossGuard`` (nan_guard.py): stops at a NaN or infinite loss, before a checkpoint.
- ``PrecisionBeforeRestore`` (precision.py), always, acting under a "-true" precision: converts the module before
  a checkpoint is loaded into it.
- ``Float64Metrics`` (precision.py), always, acting under ``64-true``: torchmetrics states in float64.
- ``StackDumps`` (stacks.py), always, acting with several processes: every rank's stacks to
  ``<run dir>/stacks/rank-N.txt`` on ``SIGUSR2``, and a collective that times out or loses its connection
  reported as the rank that did not arrive, with its line (before the next one kills the other ranks).
- ``StopOtherRanksOnError`` (multigpu/errors.py), ``UnshareSpawnedTensors`` (spawn.py), ``DestroyProcessGroupAtExit``
  (process_group.py), always, acting where a process group exists: an error on one rank stops the others; private
  metric states in ``ddp_spawn`` workers; the process group destroyed at exit, or gloo may abort a finished rank.
- ``checkpoint``: ``RunCheckpoint`` (checkpoint.py): ``best-<step>.ckpt`` and ``last.ckpt``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback, ModelSummary, ProgressBar, Timer
from lightning.pytorch.strategies import ModelParallelStrategy

from multigpu.callbacks.checkpoint import RunCheckpoint
from multigpu.callbacks.compile import CompileModel
from multigpu.callbacks.continuation import ExactContinuation, RunTimer
from multigpu.callbacks.loaders import EngineLoaders
from multigpu.callbacks.nan_guard import NonFiniteLoss, NonFiniteLossGuard
from multigpu.callbacks.precision import Float64Metrics, PrecisionBeforeRestore
from multigpu.callbacks.preemption import PreemptionCheckpoint
from multigpu.callbacks.process_group import DestroyProcessGroupAtExit
from multigpu.callbacks.progress import PlainProgressBar, progress_bar
from multigpu.callbacks.random_state import RandomState
from multigpu.callbacks.run_plan import RunPlan
from multigpu.callbacks.spawn import UnshareSpawnedTensors
from multigpu.callbacks.stack_dumps import StackDumps
from multigpu.callbacks.stop_other_ranks import StopOtherRanksOnError
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

#: the template's callbacks that take options (``--checkpoint.*``, ``--preemption.*``, ...), in hook order; the
#: parser builds them (``multigpu/options.py``)
CALLBACK_OPTIONS = {
    "preemption": PreemptionCheckpoint,
    "throughput": SpeedMonitor,
    "straggler": StragglerReport,
    "run_plan": RunPlan,
    "nan_guard": NonFiniteLossGuard,
    "checkpoint": RunCheckpoint,
}
#: the model-parallel strategies that clip across device meshes themselves
TEMPLATE_MODEL_PARALLEL = (FSDP2Strategy, TensorParallelStrategy)


def template_callbacks(trainer: Any, options: Any, built: Any, strategy: Any) -> tuple[list[Callback], dict[str, Any]]:
    """The run's callbacks in the order listed above, your ``--trainer.callbacks`` first, and the Trainer switches
    that go with them (Lightning's own progress bar and summary off where the template's replace them).

    ``trainer``: the built ``--trainer`` options; ``options``: the template's (``callbacks_off``, ``progress_bar``,
    ``compile``); ``built``: the parsed objects, holding the ``CALLBACK_OPTIONS`` callbacks; ``strategy``: as the
    Trainer will get it. ``switches["off"]`` is the set of callbacks left out.
    """
    off = set(options.get("callbacks_off") or [])
    callbacks = trainer.get("callbacks") or []
    callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
    switches: dict[str, Any] = {"off": off}
    bar = None if "progress_bar" in off else progress_bar(options.get("progress_bar", "auto"))
    if trainer.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
        if bar is None:
            switches["enable_progress_bar"] = False
        else:
            callbacks.append(bar)
    summary = trainer.get("enable_model_summary") is not False and not trainer.get("barebones")
    if "model_summary" in off:
        switches["enable_model_summary"] = False
    elif summary and not any(isinstance(c, ModelSummary) for c in callbacks):
        callbacks.append(FlopsAwareModelSummary())  # no column of zero FLOPs (summary.py)
        switches["enable_model_summary"] = False  # Lightning's own is replaced (else it logs that it skips it)
    if options.get("compile"):
        callbacks.append(CompileModel())
    if isinstance(strategy, ModelParallelStrategy) and not isinstance(strategy, TEMPLATE_MODEL_PARALLEL):
        callbacks.append(ClipAcrossMeshes())  # e.g. Lightning's class, given as a class_path: torch's clipping
    callbacks += [EngineLoaders(per_process=bool(options.get("batch_size_per_process"))), ExactContinuation()]
    callbacks.append(RandomState())
    max_time = trainer.get("max_time")
    if max_time is not None and not any(isinstance(c, Timer) for c in callbacks):
        # the same limit, stopping at a step boundary without an extra validation (continuation.py)
        callbacks.append(RunTimer(duration=max_time))
        switches["max_time"] = None
    if trainer.get("enable_checkpointing") is False:
        off.add("checkpoint")  # the Trainer refuses a ModelCheckpoint when checkpointing is off
    elif "checkpoint" in off:
        switches["enable_checkpointing"] = False  # else Lightning adds a ModelCheckpoint of its own
    callbacks += [built[key] for key in CALLBACK_OPTIONS if key not in off]
    # each a no-op where it does not apply (one process; a precision other than 64-true or a "-true" one)
    callbacks += [PrecisionBeforeRestore(), Float64Metrics()]
    # StackDumps before StopOtherRanksOnError: the other ranks' stacks are taken before they are killed
    callbacks += [StackDumps(), StopOtherRanksOnError(), UnshareSpawnedTensors(), DestroyProcessGroupAtExit()]
    return callbacks, switches


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
    "template_callbacks",
]
