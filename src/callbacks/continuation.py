"""Continue a finished run with larger limits, exactly: ``--ckpt_path=last`` plus a larger ``--trainer.max_steps``,
``max_epochs`` or ``max_time`` trains on as if the run had never stopped.

Lightning ends every fit by counting the current epoch as finished, also when ``max_steps``, ``max_time`` or a
callback's ``should_stop`` ended it in the middle (``FitLoop.on_advance_end``), and saves that in ``last.ckpt``: a
continued run would start the next epoch, skipping the rest of the interrupted one and shifting every later
validation. At the end of training, ``ExactContinuation`` makes the saved loop state say what a stop signal's
checkpoint says (``src/callbacks/preemption.py``): the epoch is in progress and the last step's batch is done, so
the continued run resumes at the next batch, with the same data order, validations and best checkpoint as an
uninterrupted run. A run that stopped at an epoch's end saves the next epoch's start, and its continuation starts
that epoch afresh, also under ``max_steps`` (where Lightning would restart the finished epoch's loop and skip the
new epoch). ``RunTimer`` is ``max_time``'s timer, stopping at an optimizer-step boundary like ``max_steps`` does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, Timer
from lightning.pytorch.utilities import CombinedLoader

from src.callbacks.steps import EveryNSteps
from src.compat import (
    batch_progress,
    epoch_progress,
    logging_step,
    set_logging_step,
    skip_next_validation,
    validation_follows,
)
from src.errors import notice


def epoch_interrupted(trainer: L.Trainer) -> bool:
    """Whether the training epoch in progress stopped before its last batch (``max_steps``, ``max_time``, a
    callback's ``should_stop``), as opposed to running out of batches."""
    batches = batch_progress(trainer)
    return not batches.is_last_batch and batches.current.completed < trainer.num_training_batches


def save_as_mid_epoch(trainer: L.Trainer) -> bool:
    """Turn the loop state Lightning leaves after training stopped mid-epoch into a mid-epoch position.

    Lightning's ``FitLoop.on_advance_end`` counts the interrupted epoch as processed and completed, and the epoch
    loop counts the last batch as completed and its step as logged. The state a checkpoint holds when saved in
    ``on_train_batch_end`` (a stop signal's save, which Lightning resumes at the next batch) has neither: undo
    them. Returns whether the state was changed (not when the epoch was not counted, e.g. already undone).
    """
    epochs, batches = epoch_progress(trainer), batch_progress(trainer)
    if not _all_equal(epochs.current):
        return False
    stepped = batches.current.completed % trainer.accumulate_grad_batches == 0
    for tracker in (epochs.total, epochs.current):
        tracker.processed -= 1
        tracker.completed -= 1
    for tracker in (batches.total, batches.current):
        tracker.completed -= 1
    if stepped:  # the epoch loop counts a logged step after on_train_batch_end; a resume counts it again
        set_logging_step(trainer, logging_step(trainer) - 1)
    return True


def _all_equal(counts: Any) -> bool:
    """Whether a progress tracker's ready, started, processed and completed counts agree (nothing in flight)."""
    return counts.ready == counts.started == counts.processed == counts.completed


def save_as_next_epoch_start(trainer: L.Trainer) -> None:
    """After an epoch that ran to its end, let the batch position say "0 batches of the next epoch" (the public
    ``reset_on_run`` Lightning calls when that epoch starts), so that the loader position saved with it is the
    next epoch's start rather than the end of an epoch that ``current_epoch`` already counts."""
    batch_progress(trainer).reset_on_run()


def restarts_a_finished_epoch(trainer: L.Trainer) -> bool:
    """Whether Lightning is about to restart the epoch loop on an epoch that has already ended.

    Under ``max_steps`` Lightning restarts the loops on every resume (``FitLoop.restarting``), also from a
    checkpoint saved after a complete epoch; its epoch loop then treats the new epoch as the continuation of the
    old one (it keeps its batch count and may spend the first iteration on an already-run validation).
    """
    batches = batch_progress(trainer)
    at_epoch_end = batches.current.ready == 0 or batches.is_last_batch
    return (
        trainer.fit_loop.epoch_loop.restarting
        and _all_equal(epoch_progress(trainer).current)
        and _all_equal(batches.current)
        and at_epoch_end
    )


def resumable(loader: Any) -> bool:
    """Whether Lightning saves and restores this loader's position (it has ``state_dict`` / ``load_state_dict``)."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


class ExactContinuation(Callback):
    """Save the end of training as the position it is, so that a continued run with larger limits is exact.

    - Training stopped mid-epoch (``max_steps``, ``max_time``): ``last.ckpt`` holds the epoch in progress and the
      batch reached, as a stop signal's checkpoint does; ``--ckpt_path=last`` continues at the next batch.
    - Training stopped at an epoch's end: the continued run starts the next epoch afresh, also under ``max_steps``.
    - A continued run whose training loader cannot restore its position (a plain ``DataLoader``) says so: Lightning
      restarts the interrupted epoch's data.
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if restarts_a_finished_epoch(trainer):
            trainer.fit_loop.epoch_loop.restarting = False  # the next epoch starts afresh, as without max_steps
        if trainer.fit_loop.restarted_mid_epoch:
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
                    " build the data module on src.data.GlobalBatchDataModule or give the loader"
                    " state_dict/load_state_dict."
                )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # runs before ModelCheckpoint's on_train_end (Lightning calls checkpoint callbacks last), which saves last.ckpt
        if trainer.num_training_batches == 0 or trainer.global_step == 0:
            return
        if epoch_interrupted(trainer):
            save_as_mid_epoch(trainer)
        else:
            save_as_next_epoch_start(trainer)


class RunTimer(Timer):
    """``--trainer.max_time``: Lightning's ``Timer``, stopping the way ``max_steps`` stops.

    - The time is checked at optimizer-step boundaries only: between the micro-batches of an accumulated step the
      gradients would be lost, and the continued run could not be exact.
    - A stop on time does not add a validation: Lightning validates when ``should_stop`` is set mid-epoch, which an
      uninterrupted run does not do at that step (an extra row, a changed best checkpoint and ``val/acc_best``).
      The validations the schedule asks for at that step still run.

    Its state is saved under Lightning's ``Timer`` key, so the time spent continues across resumes either way.
    """

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
            return  # between the micro-batches of one optimizer step
        stopping = trainer.should_stop
        scheduled = validation_follows(trainer)  # asked before should_stop adds a validation of its own
        super().on_train_batch_end(trainer, *args, **kwargs)
        if trainer.should_stop and not stopping and not scheduled:
            skip_next_validation(trainer)
