"""Callbacks this template adds to Lightning's: checkpoints, preemption handling and plain progress lines."""

from src.callbacks.checkpoint import RunCheckpoint
from src.callbacks.preemption import PreemptionCheckpoint
from src.callbacks.progress import PlainProgressBar, progress_bar

__all__ = ["PlainProgressBar", "PreemptionCheckpoint", "RunCheckpoint", "progress_bar"]
