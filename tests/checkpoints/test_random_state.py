"""Every checkpoint carries every rank's generators; a resume restores them, or says why it cannot.

The equality of stopped-and-resumed runs with dropout on is proven once per launcher elsewhere (one device, dp,
ddp and ddp_spawn in tests/faults/test_preemption.py, fsdp2 in tests/strategies/test_model_parallel.py,
tensor_parallel in tests/examples/test_gpt_model_parallel.py). These tests cover what those cannot: the saved
format, a checkpoint written by another number of processes, a checkpoint written before the state was saved,
and a data module of the user's own whose loaders draw from the global generator.
"""

from __future__ import annotations

import random
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from multigpu.checkpoints.random_state import collect, derived_seed, restore
from tests.cli import main
from tests.conftest import TINY
from tests.faults.test_preemption import validation_rows
from tests.fixtures.workload import gaussian_clusters

RUN = [
    *TINY,
    "--progress_bar=none",
    "--trainer.precision=64-true",
    "--model.init_args.dropout=0.2",
    "--trainer.limit_val_batches=2",
    "--trainer.val_check_interval=2",
    "--trainer.check_val_every_n_epoch=null",
]


def draws() -> tuple[float, float, float]:
    return torch.rand(1).item(), float(np.random.rand()), random.random()


def test_restored_generators_draw_what_they_drew_after_the_save(tmp_path):
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    draws()
    state = collect(devices=[])
    torch.save(state, tmp_path / "state.pt")
    expected = draws()
    draws()  # the stream moves on, as a resumed process's start-up moves it
    restore(torch.load(tmp_path / "state.pt", weights_only=True))  # as safe to load as the rest of a checkpoint
    assert draws() == expected


def test_a_seed_derived_for_another_world_size_differs_per_rank_and_repeats():
    saved = [collect(devices=[]), collect(devices=[])]
    seeds = [derived_seed(saved, seed=42, rank=rank) for rank in range(4)]
    assert len(set(seeds)) == 4
    assert seeds == [derived_seed(saved, seed=42, rank=rank) for rank in range(4)]
    assert derived_seed(saved, seed=43, rank=0) != seeds[0]


def _last(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.ckpt"


def test_checkpoint_holds_each_rank_state_and_old_or_other_world_size_checkpoints_resume(tmp_path, capsys):
    first = tmp_path / "first"
    main(["fit", *RUN, f"--trainer.default_root_dir={first}", "--trainer.max_steps=4"])
    checkpoint = torch.load(_last(first), weights_only=True)  # loadable as a weights-only checkpoint
    state = checkpoint["callbacks"]["RandomState"]
    assert state["world_size"] == 1 and len(state["ranks"]) == 1
    assert set(state["ranks"][0]) >= {"torch", "cuda", "python", "numpy"}

    # a checkpoint of 2 processes resumed by 1: the state is derived (not rank 0's), and the run says so
    two = tmp_path / "two"
    (two / "checkpoints").mkdir(parents=True)
    other = collect(devices=[])
    checkpoint["callbacks"]["RandomState"] = {**state, "world_size": 2, "ranks": [state["ranks"][0], other]}
    torch.save(checkpoint, _last(two))
    capsys.readouterr()
    main(["fit", *RUN, f"--trainer.default_root_dir={two}", "--trainer.max_steps=8", "--ckpt_path=last"])
    err = capsys.readouterr().err
    assert "written by 2 process(es) and this run has 1" in err and "derived" in err
    # as rank 0's restored state would have continued: the same run resumed from the 1-process checkpoint
    main(["fit", *RUN, f"--trainer.default_root_dir={first}", "--trainer.max_steps=8", "--ckpt_path=last"])
    assert validation_rows(two) != validation_rows(first)[-len(validation_rows(two)) :]

    # a checkpoint without the entry (written before the template saved it) resumes and says it is not exact
    old = tmp_path / "old"
    (old / "checkpoints").mkdir(parents=True)
    del checkpoint["callbacks"]["RandomState"]
    torch.save(checkpoint, _last(old))
    capsys.readouterr()
    main(["fit", *RUN, f"--trainer.default_root_dir={old}", "--trainer.max_steps=8", "--ckpt_path=last"])
    err = capsys.readouterr().err
    assert "holds no random-number state" in err
    assert torch.load(_last(old), weights_only=True)["global_step"] == 8


@pytest.mark.slow
def test_a_users_plain_loader_resumed_at_an_epoch_start_continues_exactly(tmp_path):
    """A ``DataLoader(shuffle=True)`` of the user's draws its sampler's and workers' seeds from the global
    generator when each epoch starts: a run ended by ``max_epochs`` and continued with a larger one draws them
    where the uninterrupted run did."""
    args = [
        *RUN,
        "--data=tests.checkpoints.test_random_state.PlainData",
        "--trainer.max_steps=-1",
        "--trainer.val_check_interval=null",
        "--trainer.check_val_every_n_epoch=1",
    ]
    straight, continued = tmp_path / "straight", tmp_path / "continued"
    main(["fit", *args, f"--trainer.default_root_dir={straight}", "--trainer.max_epochs=3"])
    main(["fit", *args, f"--trainer.default_root_dir={continued}", "--trainer.max_epochs=1"])
    main(["fit", *args, f"--trainer.default_root_dir={continued}", "--trainer.max_epochs=3", "--ckpt_path=last"])
    assert len(validation_rows(straight)) == 3
    assert validation_rows(continued) == validation_rows(straight)


class PlainData(L.LightningDataModule):
    """Plain loaders, as a user writes them: a shuffling training loader without a generator of its own."""

    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str | None = None) -> None:
        self.train_set = gaussian_clusters(256, 16, 4, seed=0, split=0)
        self.val_set = gaussian_clusters(64, 16, 4, seed=0, split=1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)
