"""Continue a finished run with larger limits exactly. Lightning counts the epoch a fit ended in as finished, also
mid-epoch (``FitLoop.on_advance_end``), so a continued run would skip the rest of it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, Timer
from lightning.pytorch.utilities import CombinedLoader

from multigpu.compat import (
    batch_progress,
    epoch_loop_restarting,
    epoch_progress,
    logging_step,
    reset_batch_position,
    restarted_mid_epoch,
    set_logging_step,
    skip_next_validation,
    start_next_epoch_afresh,
    validation_follows,
)
from multigpu.data.engine_loaders import EngineLoaders
from multigpu.data.position import restores_itself as resumable
from multigpu.errors import notice
from multigpu.steps import EveryNSteps


def epoch_interrupted(trainer: L.Trainer) -> bool:
    """Whether the training epoch in progress stopped before its last batch, not by running out of batches."""
    batches = batch_progress(trainer)
    return not batches.is_last_batch and batches.current.completed < trainer.num_training_batches


def save_as_mid_epoch(trainer: L.Trainer) -> bool:
    """Undo what Lightning counts after training stopped mid-epoch, as in a checkpoint saved in
    ``on_train_batch_end``; whether anything changed."""
    epochs, batches = epoch_progress(trainer), batch_progress(trainer)
    if not _all_equal(epochs.current):
        return False
    stepped = batches.current.completed % trainer.accumulate_grad_batches == 0
    uncount_epoch_end(trainer)
    if stepped:  # the epoch loop counts a logged step after on_train_batch_end; a resume counts it again
        set_logging_step(trainer, logging_step(trainer) - 1)
    return True


def uncount_epoch_end(trainer: L.Trainer) -> None:
    """Take back the epoch's and last batch's completion Lightning counts after a fit stopped mid-epoch."""
    epochs, batches = epoch_progress(trainer), batch_progress(trainer)
    for tracker in (epochs.total, epochs.current):
        tracker.processed -= 1
        tracker.completed -= 1
    for tracker in (batches.total, batches.current):
        tracker.completed -= 1


def _all_equal(counts: Any) -> bool:
    return counts.ready == counts.started == counts.processed == counts.completed


def save_as_next_epoch_start(trainer: L.Trainer) -> None:
    """After an epoch that ran to its end, save the batch position as the next epoch's start."""
    reset_batch_position(trainer)


def restarts_a_finished_epoch(trainer: L.Trainer) -> bool:
    """Whether Lightning (under ``max_steps``) is about to treat a new epoch as continuing one that ended."""
    batches = batch_progress(trainer)
    at_epoch_end = batches.current.ready == 0 or batches.is_last_batch
    return (
        epoch_loop_restarting(trainer)
        and _all_equal(epoch_progress(trainer).current)
        and _all_equal(batches.current)
        and at_epoch_end
    )


def samples_training_loaders(trainer: L.Trainer) -> bool:
    return any(isinstance(callback, EngineLoaders) and callback.active for callback in trainer.callbacks)


class ExactContinuation(Callback):
    """Save the end of training as the position it is (mid-epoch, or the next epoch's start), so that a continued
    run with larger limits is exact; a continued run whose loader cannot restore its position says so."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if restarts_a_finished_epoch(trainer):
            start_next_epoch_afresh(trainer)
        if restarted_mid_epoch(trainer) and not samples_training_loaders(trainer):
            plain = [
                type(loader).__name__
                for loader in CombinedLoader(trainer.train_dataloader).flattened
                if not resumable(loader)
            ]
            if plain:
                done = batch_progress(trainer).current.processed  # completed lags by one here
                notice(
                    f"resuming in the middle of epoch {trainer.current_epoch} (after {done} training batches), but"
                    f" the training {', '.join(plain)} has no state_dict/load_state_dict, so Lightning restarts that"
                    " epoch's data from its first batch and ends the epoch after the batches it has left: some"
                    " samples of this epoch are trained twice and others not at all. For an exact continuation,"
                    " build the data module on multigpu.data.GlobalBatchDataModule or give the loader"
                    " state_dict/load_state_dict."
                )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # before ModelCheckpoint's on_train_end (Lightning calls checkpoint callbacks last), which saves last.ckpt
        if trainer.num_training_batches == 0 or trainer.global_step == 0:
            return
        if epoch_interrupted(trainer):
            save_as_mid_epoch(trainer)
        else:
            save_as_next_epoch_start(trainer)


class RunTimer(Timer):
    """``--trainer.max_time`` as Lightning's ``Timer``, stopping as ``max_steps`` does: at an optimizer step, without
    the extra validation Lightning runs when ``should_stop`` is set mid-epoch."""

    def __init__(self, duration: str | timedelta | dict[str, int] | None = None, verbose: bool = True) -> None:
        super().__init__(duration=duration, interval="step", verbose=verbose)
        self._new_step = EveryNSteps()

    @property
    def state_key(self) -> str:
        return "Timer"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._new_step = EveryNSteps(start=trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if not self._new_step.due(trainer.global_step):
            return
        stopping = trainer.should_stop
        scheduled = validation_follows(trainer)  # asked before should_stop adds a validation of its own
        super().on_train_batch_end(trainer, *args, **kwargs)
        if trainer.should_stop and not stopping and not scheduled:
            skip_next_validation(trainer)
