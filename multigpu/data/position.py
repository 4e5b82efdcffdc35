"""The training loaders' position in their epoch: the batches trained (workers read ahead), and each rank's states."""

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
    """``states``: ``{"world_size": n, "ranks": [[state, ...], ...]}``, or None."""

    epoch: int
    batches_done: int
    epoch_length: int
    states: dict[str, Any] | None = None

    def start(self) -> tuple[int, int]:
        if self.batches_done >= self.epoch_length:
            return self.epoch + 1, 0
        return self.epoch, self.batches_done

    def entry(self) -> dict[str, Any]:
        counts = {"epoch": self.epoch, "batches_done": self.batches_done, "epoch_length": self.epoch_length}
        return counts if self.states is None else {**counts, "loaders": self.states}


def training_position(trainer: L.Trainer) -> Position:
    return Position(
        epoch=trainer.current_epoch,
        # `completed` does not yet count the batch just trained while `on_train_batch_end` callbacks save
        batches_done=batch_progress(trainer).current.processed,
        epoch_length=int(min(trainer.num_training_batches, 2**62)),
    )


def saved_position(trainer: L.Trainer, batches: TrainBatches | None = None) -> Position:
    """The training position with every rank's loader states (a collective where there are any)."""
    position = training_position(trainer)
    loaders = stateful_loaders(trainer.train_dataloader)
    if not loaders:
        return position
    states = gathered([loader_state(loader, position.batches_done, batches) for loader in loaders])
    return Position(**{**vars(position), "states": {"world_size": trainer.world_size, "ranks": states}})


def read_position(entry: dict[str, Any]) -> Position | None:
    if not entry:
        return None
    position = Position(int(entry["epoch"]), int(entry["batches_done"]), int(entry["epoch_length"]))
    states = entry.get("loaders")
    if states is None:
        return position
    counts = position.entry()
    # a state equal to the counts (GlobalBatchDataModule's loader, in older checkpoints) is left: the counts place it
    ranks = [[state for state in rank if state != counts] for rank in states["ranks"]]
    if not any(ranks):
        return position
    return Position(**{**vars(position), "states": {**states, "ranks": ranks}})


def stateful_loaders(loaders: Any) -> list[Any]:
    if loaders is None:
        return []
    flattened = loaders.flattened if isinstance(loaders, CombinedLoader) else CombinedLoader(loaders).flattened
    return [loader for loader in flattened if restores_itself(loader) or positioned(loader)]


def restores_itself(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def positioned(loader: Any) -> bool:
    return isinstance(getattr(loader, "dataset", None), StatePerBatch)


def loader_state(loader: Any, batches_done: int, batches: TrainBatches | None = None) -> Any:
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
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values
