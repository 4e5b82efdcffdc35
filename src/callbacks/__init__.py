"""Every callback the template adds to a run, in the order the Trainer holds them (the order Lightning calls
them at each hook).

``TemplateCLI.instantiate_trainer`` (``src/cli.py``) builds the one list before the Trainer: your own
``--trainer.callbacks`` first, then these; Lightning moves ``ModelCheckpoint`` to the end, after LightningCLI's
``SaveConfigCallback``, and nothing is added once the Trainer is built. Leave an optional one out with
``--callbacks_off=[name, ...]`` (or ``callbacks_off:`` in a config); the always-on ones make a run correct and do
nothing where they do not apply. README "The training step" tells the hooks each runs at.

- ``progress_bar``: ``PlainProgressBar`` or Rich (progress.py): a line every 50 steps and after each validation.
- ``model_summary``: ``ModelSummary`` (summary.py): the parameter table at fit start, FLOPs only where known.
- ``CompileModel`` (compile.py), on with ``--compile=true``: compiles the model's ``forward`` at setup.
- ``ClipAcrossMeshes`` (src/strategies/model_parallel.py), with a ``ModelParallelStrategy`` given as a class other
  than the template's (Lightning's own): gradient clipping across device meshes, as fsdp2 and tensor_parallel clip.
- ``ExactContinuation`` (continuation.py), always: saves a stop as the position it is, so that
  ``--ckpt_path=last`` with larger limits continues exactly.
- ``RandomState`` (random_state.py), always: every rank's random-number generators in every checkpoint, each
  rank's own restored when a fit resumes (dropout draws what an uninterrupted run draws).
- ``RunTimer`` (continuation.py), with ``--trainer.max_time``: that limit, stopping at a step boundary.
- ``preemption``: ``PreemptionCheckpoint`` (preemption.py): on a stop signal, save ``last.ckpt``, stop, requeue
  (off: Lightning's own handlers, which save inside the signal handler).
- ``throughput``: ``SpeedMonitor`` (throughput.py): ``perf/*`` (samples/s, MFU, memory, data wait).
- ``run_plan``: ``RunPlan`` (run_plan.py): prints and saves ``run_plan.json`` when training starts.
- ``nan_guard``: ``NonFiniteLossGuard`` (nan_guard.py): stops at a NaN or infinite loss, before a checkpoint.
- ``PrecisionBeforeRestore`` (precision.py), always, acting under a "-true" precision: converts the module before
  a checkpoint is loaded into it.
- ``Float64Metrics`` (precision.py), always, acting under ``64-true``: torchmetrics states in float64.
- ``StopOtherRanksOnError`` (src/errors.py), ``UnshareSpawnedTensors`` (spawn.py), ``DestroyProcessGroupAtExit``
  (process_group.py), always, acting with several processes: an error on one rank stops the others; private
  metric states in ``ddp_spawn`` workers; the process group destroyed at exit, or gloo may abort a finished rank.
- ``checkpoint``: ``RunCheckpoint`` (checkpoint.py): ``best-<step>.ckpt`` and ``last.ckpt``.
"""

from src.callbacks.checkpoint import RunCheckpoint
from src.callbacks.nan_guard import NonFiniteLoss, NonFiniteLossGuard
from src.callbacks.preemption import PreemptionCheckpoint
from src.callbacks.progress import PlainProgressBar, progress_bar
from src.callbacks.run_plan import RunPlan
from src.callbacks.throughput import SpeedMonitor

#: the names ``--callbacks_off`` accepts
OPTIONAL_CALLBACKS = (
    "progress_bar",
    "model_summary",
    "preemption",
    "throughput",
    "run_plan",
    "nan_guard",
    "checkpoint",
)

__all__ = [
    "OPTIONAL_CALLBACKS",
    "NonFiniteLoss",
    "NonFiniteLossGuard",
    "PlainProgressBar",
    "PreemptionCheckpoint",
    "RunCheckpoint",
    "RunPlan",
    "SpeedMonitor",
    "progress_bar",
]
