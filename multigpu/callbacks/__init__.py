"""Every callback the engine adds to a run. The order the Trainer holds them in, which is the order Lightning calls
them at each hook, is one literal list: ``run_callbacks`` in ``multigpu/run.py``, your own ``--trainer.callbacks``
first; Lightning appends LightningCLI's ``SaveConfigCallback`` and moves ``ModelCheckpoint`` to the end, and nothing
is added or moved once the Trainer is built. Leave an optional one out with ``--callbacks_off=[name, ...]`` (or
``callbacks_off:`` in a config); the always-on ones make a run correct and do nothing where they do not apply.
docs/engine.md ("What runs around your training step") tells the hooks each runs at. What each does:

- ``throughput``: ``SpeedMonitor`` (throughput.py): ``perf/*`` (samples/s, MFU, memory, data wait), before the
  progress bar, which shows the interval it measured.
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
- ``straggler``: ``StragglerReport`` (straggler.py), acting where a process group exists: every
  ``log_every_n_steps`` the ranks exchange their own time per batch; rank 0 names a rank slower than the median
  by ``--straggler.factor`` and logs ``perf/straggler_ratio``.
- ``run_plan``: ``RunPlan`` (run_plan.py): prints and saves ``run_plan.json`` when training starts.
- ``nan_guard``: ``NonFiniteLossGuard`` (nan_guard.py): stops at a NaN or infinite loss, before a checkpoint.
- ``PrecisionBeforeRestore`` (precision.py), always, acting under a "-true" precision: converts the module before
  a checkpoint is loaded into it.
- ``Float64Metrics`` (precision.py), always, acting under ``64-true``: torchmetrics states in float64.
- ``StackDumps`` (stack_dumps.py), always, acting with several processes: every rank's stacks to
  ``<run dir>/stacks/rank-N.txt`` on ``SIGUSR2``, and a collective that times out or loses its connection
  reported as the rank that did not arrive, with its line (before the next one kills the other ranks).
- ``StopOtherRanksOnError``, ``UnshareSpawnedTensors``, ``DestroyProcessGroupAtExit`` (ranks.py), always, acting
  where a process group exists: an error on one rank stops the others; private metric states in ``ddp_spawn``
  workers; the process group destroyed at exit, or gloo may abort a finished rank.
- ``checkpoint``: ``RunCheckpoint`` (checkpoint.py): ``best-<step>.ckpt`` and ``last.ckpt``.
"""

from __future__ import annotations

from multigpu.callbacks.checkpoint import RunCheckpoint
from multigpu.callbacks.nan_guard import NonFiniteLoss, NonFiniteLossGuard
from multigpu.callbacks.preemption import PreemptionCheckpoint
from multigpu.callbacks.progress import PlainProgressBar, progress_bar
from multigpu.callbacks.run_plan import RunPlan
from multigpu.callbacks.stack_dumps import StackDumps
from multigpu.callbacks.straggler import StragglerReport
from multigpu.callbacks.throughput import SpeedMonitor

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

#: the engine's callbacks that take options (``--checkpoint.*``, ``--preemption.*``, ...); the parser builds them
#: (``multigpu/parser.py``)
CALLBACK_OPTIONS = {
    "preemption": PreemptionCheckpoint,
    "throughput": SpeedMonitor,
    "straggler": StragglerReport,
    "run_plan": RunPlan,
    "nan_guard": NonFiniteLossGuard,
    "checkpoint": RunCheckpoint,
}
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
]
