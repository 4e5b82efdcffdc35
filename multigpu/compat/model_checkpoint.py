"""The undocumented names of Lightning's ``ModelCheckpoint`` the engine relies on (re-exported by ``compat``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import lightning as L
from torch import Tensor

if TYPE_CHECKING:
    from lightning.pytorch.callbacks import ModelCheckpoint


def monitor_candidates(checkpoint: ModelCheckpoint, trainer: L.Trainer) -> dict[str, Tensor]:
    """The metrics ``ModelCheckpoint`` decides on and names its files with now (``epoch`` and ``step`` among them)."""
    return checkpoint._monitor_candidates(trainer)


def save_last_checkpoint(checkpoint: ModelCheckpoint, trainer: L.Trainer, candidates: dict[str, Tensor]) -> None:
    """Write ``last.ckpt`` now the way ``ModelCheckpoint`` (or a subclass's override) writes it."""
    checkpoint._save_last_checkpoint(trainer, candidates)


def checkpoint_schedule(checkpoint: ModelCheckpoint) -> tuple[int, timedelta | None]:
    """``every_n_train_steps`` (0 where another schedule is set) and ``train_time_interval`` as it keeps them."""
    return checkpoint._every_n_train_steps, checkpoint._train_time_interval


def interval_clock(checkpoint: ModelCheckpoint) -> float | None:
    """When (``time.monotonic()``) its ``train_time_interval`` clock last restarted; None before the first batch."""
    return checkpoint._last_time_checked


def restart_interval_clock(checkpoint: ModelCheckpoint, now: float) -> None:
    """Restart that clock at ``now``, as ``ModelCheckpoint`` does when its interval falls due."""
    checkpoint._last_time_checked = now


def checkpoint_not_due(checkpoint: ModelCheckpoint, trainer: L.Trainer) -> bool:
    """Whether ``ModelCheckpoint`` saves nothing now whatever its schedule (a smoke test, the sanity check, ...)."""
    return checkpoint._should_skip_saving_checkpoint(trainer)


def last_checkpoint_written(checkpoint: ModelCheckpoint) -> tuple[int, str]:
    """The step and path of the file ``ModelCheckpoint`` wrote last."""
    return checkpoint._last_global_step_saved, checkpoint._last_checkpoint_saved


def record_checkpoint_written(checkpoint: ModelCheckpoint, trainer: L.Trainer, path: str) -> None:
    """Record ``path`` as written at this step, as ``ModelCheckpoint._save_checkpoint`` does after writing it."""
    checkpoint._last_global_step_saved, checkpoint._last_checkpoint_saved = trainer.global_step, path


def versions_checkpoint_names(checkpoint: ModelCheckpoint) -> bool:
    """Whether ``ModelCheckpoint`` adds ``-v1``, ``-v2`` to a name that exists (``enable_version_counter``)."""
    return checkpoint._enable_version_counter


def trained_class_path(hyperparameters: Mapping[str, Any]) -> Any:
    """The class path LightningCLI built a checkpoint's model from, kept under a key of its own; else None."""
    return hyperparameters.get("_class_path")
