"""Where the training loaders stand in their epoch: one position, saved with every checkpoint and given back on a
resume (``EngineLoaders``, ``multigpu/callbacks/loaders.py``).

The position is the training loop's count of the batches trained, not the loaders' own (prefetching and workers read
ahead of what was trained). A loader with a state of its own (``state_dict``/``load_state_dict``: LitData's,
torchdata's ``StatefulDataLoader``), or a stream read through ``StatePerBatch``, adds its state at that point, for
every rank: a rank's place in a loader that shards itself is its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
import torch.distributed as dist
from lightning.pytorch.utilities import CombinedLoader

from multigpu.compat import batch_progress
from multigpu.data.libraries import StatePerBatch
from multigpu.data.train_batches import TrainBatches


@dataclass(frozen=True)
class Position:
    """``batches_done`` of the ``epoch_length`` batches of ``epoch`` trained; ``states``: every rank's states of its
    loaders that have one (``{"world_size": n, "ranks": [[state, ...], ...]}``), or None."""

    epoch: int
    batches_done: int
    epoch_length: int
    states: dict[str, Any] | None = None

    def start(self) -> tuple[int, int]:
        """(epoch, batches to skip) where the next pass starts: past what was trained, or at the next epoch."""
        if self.batches_done >= self.epoch_length:
            return self.epoch + 1, 0
        return self.epoch, self.batches_done

    def entry(self) -> dict[str, Any]:
        """The checkpoint entry."""
        counts = {"epoch": self.epoch, "batches_done": self.batches_done, "epoch_length": self.epoch_length}
        return counts if self.states is None else {**counts, "loaders": self.states}


def training_position(trainer: L.Trainer) -> Position:
    """Where the training loop stands in its epoch, as a checkpoint saved now resumes it."""
    return Position(
        epoch=trainer.current_epoch,
        # `processed` counts the batch whose step just finished, which `completed` does not yet count while
        # `on_train_batch_end` callbacks (ModelCheckpoint, preemption) are saving.
        batches_done=batch_progress(trainer).current.processed,
        epoch_length=int(min(trainer.num_training_batches, 2**62)),
    )


def saved_position(trainer: L.Trainer, batches: TrainBatches | None = None) -> Position:
    """The training position with every rank's states of the training loaders that have one (a collective where
    there are any: a save runs on every rank); ``batches``: the ``TrainBatches`` they are drawn through, if any."""
    position = training_position(trainer)
    loaders = stateful_loaders(trainer.train_dataloader)
    if not loaders:
        return position
    states = gathered([loader_state(loader, position.batches_done, batches) for loader in loaders])
    return Position(**{**vars(position), "states": {"world_size": trainer.world_size, "ranks": states}})


def read_position(entry: dict[str, Any]) -> Position | None:
    """The position a checkpoint entry holds (None for an empty one). A checkpoint written before
    ``GlobalBatchDataModule`` returned plain loaders holds its loader's state as the position itself: left out,
    since the position now places that loader."""
    if not entry:
        return None
    position = Position(int(entry["epoch"]), int(entry["batches_done"]), int(entry["epoch_length"]))
    states = entry.get("loaders")
    if states is None:
        return position
    counts = position.entry()
    ranks = [[state for state in rank if state != counts] for rank in states["ranks"]]
    if not any(ranks):
        return position
    return Position(**{**vars(position), "states": {**states, "ranks": ranks}})


def stateful_loaders(loaders: Any) -> list[Any]:
    """The training loaders (one, or a ``CombinedLoader``) that have a state of their own, or whose stream has
    (``StatePerBatch``), in order."""
    if loaders is None:
        return []
    flattened = loaders.flattened if isinstance(loaders, CombinedLoader) else CombinedLoader(loaders).flattened
    return [loader for loader in flattened if restores_itself(loader) or positioned(loader)]


def restores_itself(loader: Any) -> bool:
    """Whether the loader keeps its own position (``state_dict``/``load_state_dict``, as torchdata's
    ``StatefulDataLoader`` has): the engine then does not skip in it a second time."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def positioned(loader: Any) -> bool:
    return isinstance(getattr(loader, "dataset", None), StatePerBatch)


def loader_state(loader: Any, batches_done: int, batches: TrainBatches | None = None) -> Any:
    """A loader's state after ``batches_done`` batches of the epoch trained (its stream's, for ``StatePerBatch``;
    the one ``batches`` kept, for a loader Lightning draws ahead from)."""
    if positioned(loader):
        return loader.dataset.state_after(batches_done)
    if batches is not None and any(loader is drawn for drawn in batches.positioned()):
        return batches.state_after(loader, batches_done)
    return loader.state_dict()


def load_loader_state(loader: Any, state: Any, batches_done: int) -> None:
    if positioned(loader):
        loader.dataset.restore(state, batches_done)
    else:
        loader.load_state_dict(state)


def gathered(value: Any) -> list[Any]:
    """``value`` of every process, in rank order (this process's alone without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values
