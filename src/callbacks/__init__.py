"""Callbacks this template adds to Lightning's: checkpoints, preemption handling, progress lines, throughput and
MFU, the run plan, and a guard against non-finite losses."""

from src.callbacks.checkpoint import RunCheckpoint
from src.callbacks.nan_guard import NonFiniteLoss, NonFiniteLossGuard
from src.callbacks.preemption import PreemptionCheckpoint
from src.callbacks.progress import PlainProgressBar, progress_bar
from src.callbacks.run_plan import RunPlan
from src.callbacks.throughput import SpeedMonitor

__all__ = [
    "NonFiniteLoss",
    "NonFiniteLossGuard",
    "PlainProgressBar",
    "PreemptionCheckpoint",
    "RunCheckpoint",
    "RunPlan",
    "SpeedMonitor",
    "progress_bar",
]
