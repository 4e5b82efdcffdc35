"""Every callback the template adds to a run, in the order Lightning calls them at each hook.

Optional ones are switched off by name with ``--callbacks_off=[name, ...]`` (or ``callbacks_off:`` in a config
file); the others are what makes a run correct and stay on. ``TemplateCLI.instantiate_trainer`` (``src/cli.py``)
builds this list; ``--trainer.callbacks`` of your own run before all of them.

=====================  ===============================  ===========================================================
name (switch)          class (module)                   what it does, at which hook
=====================  ===============================  ===========================================================
progress_bar           ``PlainProgressBar`` / Rich      a line every 50 steps and after each validation, or a Rich
                       (progress.py)                    bar on a terminal (``--progress_bar`` picks which)
model_summary          ``ModelSummary`` (summary.py)    the parameter table at ``on_fit_start``, with FLOPs only
                                                        where known
(``--compile=true``)   ``CompileModel`` (compile.py)    compiles ``forward`` at ``setup``; off unless asked for
always on              ``ExactContinuation``            at ``on_train_end``: saves a stop as the position it is, so
                       (continuation.py)                ``--ckpt_path=last`` with larger limits continues exactly
always on, with        ``RunTimer`` (continuation.py)   ``--trainer.max_time`` itself: checked at each step's
``max_time``                                            ``on_train_batch_end``, stopping at a step boundary
preemption             ``PreemptionCheckpoint``         a stop signal's flag, checked at ``on_train_batch_end``:
                       (preemption.py)                  save ``last.ckpt``, stop, requeue (off: Lightning's own
                                                        handlers, which save inside the signal handler)
throughput             ``SpeedMonitor`` (throughput.py) clocks each batch; every ``log_every_n_steps`` it logs
                                                        ``perf/*`` (samples/s, MFU, memory, data wait)
run_plan               ``RunPlan`` (run_plan.py)        at ``on_train_start``: prints and saves ``run_plan.json``
nan_guard              ``NonFiniteLossGuard``           ``on_before_backward``: records a NaN/inf loss; raises
                       (nan_guard.py)                   before the next checkpoint or every N steps
checkpoint             ``RunCheckpoint`` (checkpoint)   ``best-<step>.ckpt`` and ``last.ckpt`` (Lightning runs it
                                                        after every other callback)
always on, 64-true     ``Float64Metrics`` (precision)   torchmetrics states in float64 at each stage's start
always on, >1 process  ``StopOtherRanksOnError``        an exception on one rank stops the others (src/errors.py)
always on, >1 process  ``UnshareSpawnedTensors``        ``setup``: ddp_spawn workers get private metric states
                       (spawn.py)
always on, >1 process  ``DestroyProcessGroupAtExit``    registers ``destroy_process_group`` at exit (gloo aborts
                       (process_group.py)               otherwise)
=====================  ===============================  ===========================================================

The per-step cost of all of them together is measured by ``scripts/step_overhead.py``.
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
