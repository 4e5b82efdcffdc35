"""Every rank's random-number generators in every checkpoint, so that a resumed run draws the dropout masks the
uninterrupted run draws (Lightning saves none); put back at ``on_train_start``, after the loader drew its seed."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader

from multigpu.compat import batch_progress, draw_loader_base_seed
from multigpu.errors import notice

try:
    import numpy as np
except ImportError:
    np = None  # type: ignore[assignment]

#: only tensors, numbers, strings and containers: the checkpoint still loads with ``weights_only=True``
FORMAT = 1


def cuda_devices(trainer: L.Trainer) -> list[int]:
    """The CUDA devices this rank computes on: all of ``dp``'s, else the strategy's root device."""
    if not torch.cuda.is_available():
        return []
    devices = getattr(trainer.strategy, "parallel_devices", None) or [trainer.strategy.root_device]
    return sorted({d.index if d.index is not None else 0 for d in devices if d.type == "cuda"})


def collect(devices: list[int]) -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "cuda": {index: torch.cuda.get_rng_state(index) for index in devices},
        "python": random.getstate(),
    }
    if np is not None:
        numpy_state = np.random.get_state(legacy=False)
        state["numpy"] = {
            "bit_generator": numpy_state["bit_generator"],
            "key": torch.from_numpy(numpy_state["state"]["key"].astype("int64")),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        }
    return state


def restore(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    for index, cuda_state in state.get("cuda", {}).items():
        if torch.cuda.is_available() and int(index) < torch.cuda.device_count():
            torch.cuda.set_rng_state(cuda_state, int(index))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state.get("numpy")
    if np is not None and numpy_state is not None:
        np.random.set_state(
            {
                "bit_generator": numpy_state["bit_generator"],
                "state": {"key": numpy_state["key"].numpy().astype("uint32"), "pos": numpy_state["pos"]},
                "has_gauss": numpy_state["has_gauss"],
                "gauss": numpy_state["gauss"],
            }
        )


def derived_seed(saved: list[dict[str, Any]], seed: int, rank: int) -> int:
    """A seed for ``rank`` of a run resumed at another world size: ranks differ, and a second resume draws the same."""
    digest = hashlib.sha256(f"{seed}:{rank}".encode())
    for state in saved:
        digest.update(state["torch"].numpy().tobytes())
    return int.from_bytes(digest.digest()[:8], "little") % 2**63


def seed_all(seed: int) -> None:
    """Seed every generator ``collect`` saves (``seed_everything`` would change PL_GLOBAL_SEED, the data order)."""
    torch.manual_seed(seed)
    random.seed(seed)
    if np is not None:
        np.random.seed(seed % 2**32)


def gather(state: dict[str, Any], world_size: int) -> list[dict[str, Any]]:
    """Every rank's ``state``, in rank order (a collective)."""
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [state]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return states


def redraw_worker_seeds(trainer: L.Trainer) -> None:
    """Draw what starting the epoch's loader iterators draws, where a resumed fit starts a new epoch: Lightning made
    them before the restore."""
    if trainer.current_epoch == 0 or batch_progress(trainer).current.ready != 0:
        return
    for loader in CombinedLoader(trainer.train_dataloader).flattened:
        if isinstance(loader, DataLoader) and loader.generator is None:
            draw_loader_base_seed()


class RandomState(Callback):
    """Save every rank's generators with each checkpoint; put each rank's own back when a fit resumes."""

    def __init__(self) -> None:
        self._saved: dict[str, Any] | None = None
        self._resuming = False

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        states = gather(collect(cuda_devices(trainer)), trainer.world_size)
        return {"format": FORMAT, "world_size": trainer.world_size, "ranks": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._resuming = True  # load_state_dict follows only if the checkpoint has our entry

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        saved, self._saved = self._saved, None
        resuming, self._resuming = self._resuming, False
        if saved is None:
            if resuming and trainer.is_global_zero:
                notice(
                    "the checkpoint holds no random-number state (it was written before the template saved it):"
                    " the run resumes, but dropout and other random draws differ from an uninterrupted run."
                )
            return
        if saved["world_size"] == trainer.world_size:
            restore(saved["ranks"][trainer.global_rank])
            redraw_worker_seeds(trainer)
            return
        seed = int(torch.initial_seed())
        seed_all(derived_seed(saved["ranks"], seed, trainer.global_rank))
        if trainer.is_global_zero:
            notice(
                f"the checkpoint was written by {saved['world_size']} process(es) and this run has"
                f" {trainer.world_size}: each rank's random-number state is derived from the saved ones, the seed and"
                " the rank, so random draws (dropout) differ from an uninterrupted run; everything else resumes"
                " exactly."
            )
