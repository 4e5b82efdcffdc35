"""What the compatibility seam's tests share: a real one-process group, a small CPU Trainer, a callback that runs
functions in its hooks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import pytest
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from tests.fixtures.workload import TinyData


@pytest.fixture
def one_process_group(tmp_path) -> Iterator[None]:
    """A real (gloo, one process) default process group, as under ddp."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


BATCHES = 4  # training batches per epoch of the small runs below


def trainer(**kwargs: Any) -> L.Trainer:
    """A Trainer for a few CPU steps, with nothing the test does not ask for."""
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        limit_train_batches=BATCHES,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**options, **kwargs})


def tiny_data() -> TinyData:
    return TinyData(train_size=32 * BATCHES, val_size=32, test_size=32)


class Hooks(Callback):
    """Runs the given functions in the named hooks (``on_train_batch_end=fn(trainer, batch_idx)``, the others
    ``fn(trainer)``)."""

    def __init__(self, **hooks: Callable[..., Any]) -> None:
        self.hooks = hooks

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.hooks.get("on_train_start", lambda trainer: None)(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.hooks.get("on_train_batch_end", lambda trainer, index: None)(trainer, args[-1])

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.hooks.get("on_validation_start", lambda trainer: None)(trainer)
