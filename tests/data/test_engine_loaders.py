"""The engine's sampling put into a Trainer's training loaders by ``EngineLoaders``, in process on one device: what
Lightning iterates, the refusals before anything runs, and the line that heads an error of the user's own code."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from multigpu.data.engine_loaders import EngineLoaders
from multigpu.data.loaders import EngineSampler, SeededSamples
from multigpu.errors import ConfigurationError


def fit(data: L.LightningDataModule, callback: EngineLoaders | None = None, **kwargs) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback or EngineLoaders()], **kwargs,
    )  # fmt: skip
    trainer.fit(BoringModel(), datamodule=data)
    return trainer


class Vectors(L.LightningDataModule):
    def __init__(self, **loader) -> None:
        super().__init__()
        self.loader = loader

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(40, 32)), collate_fn=lambda s: torch.stack([x for (x,) in s]),
                          **self.loader)  # fmt: skip


def test_the_loader_lightning_iterates_is_the_users_with_the_engines_sampling():
    trainer = fit(Vectors(batch_size=8, shuffle=True))
    loader = trainer.train_dataloader
    assert isinstance(loader.sampler, EngineSampler) and loader.sampler.shuffle
    assert isinstance(loader.dataset, SeededSamples) and loader.batch_size == 8
    assert loader.collate_fn([(torch.ones(2),)]).shape == (1, 2)  # the user's collate_fn
    assert loader.generator is not None  # a generator of its own: nothing drawn from the global one


def test_the_per_process_switch_and_the_use_distributed_sampler_switch():
    trainer = fit(Vectors(batch_size=8), EngineLoaders(per_process=True))
    assert trainer.train_dataloader.sampler.meaning.startswith("per process")
    trainer = fit(Vectors(batch_size=8), use_distributed_sampler=False)
    assert not isinstance(trainer.train_dataloader.sampler, EngineSampler)


@pytest.mark.parametrize(
    ("loader", "refusal"),
    [
        ({"batch_size": 0}, r"Vectors.train_dataloader\(\) made a loader that torch refused: batch_size should be"),
        ({"batch_size": 64}, r"has batch_size=64, .* more than its 40 samples"),
    ],
)
def test_a_refused_loader_stops_the_fit_in_one_paragraph_before_training(loader, refusal):
    with pytest.raises(ConfigurationError, match=refusal) as error:
        fit(Vectors(**loader))
    assert "\n" not in str(error.value) and "Fix:" in str(error.value)


class Broken(L.LightningDataModule):
    def train_dataloader(self):
        raise KeyError("no such split")


def test_an_error_of_the_users_own_code_keeps_its_type_and_says_where_it_came_from():
    with pytest.raises(KeyError) as error:
        fit(Broken())
    assert error.value.multigpu_origin == "Broken.train_dataloader(), the data module's own code"


class OwnBatches(L.LightningDataModule):
    def train_dataloader(self):
        data = torch.randn(16, 32)
        return DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), 4, drop_last=True))


def test_a_batch_sampler_of_the_users_own_is_kept_on_one_process():
    trainer = fit(OwnBatches())
    assert type(trainer.train_dataloader.batch_sampler) is BatchSampler
    assert not isinstance(trainer.train_dataloader.sampler, EngineSampler)


def test_an_evaluation_loader_under_several_processes_reads_every_sample_once_in_as_many_batches_on_each():
    from multigpu.data.loaders import World

    dataset = [{"x": torch.tensor(float(i))} for i in range(13)]
    loader = DataLoader(dataset, batch_size=4, collate_fn=lambda s: torch.stack([d["x"] for d in s]))
    shares = [
        [batch.tolist() for batch in EngineLoaders()._evaluation(loader, World(2, rank, 1, 0), "Data.val_dataloader()")]
        for rank in (0, 1)
    ]
    assert len(shares[0]) == len(shares[1]) == 3  # global batches of 4, the last one of 5 (1 sample joins it)
    assert sorted(x for share in shares for batch in share for x in batch) == [float(i) for i in range(13)]
    assert [sorted(a + b) for a, b in zip(*shares, strict=True)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11, 12]]


def test_overfit_batches_leaves_the_loaders_to_lightning():
    trainer = fit(Vectors(batch_size=8, shuffle=True), overfit_batches=1)
    assert not isinstance(trainer.train_dataloader.sampler, EngineSampler)


def test_a_global_batch_data_modules_own_loader_keeps_its_global_batch_whatever_the_switches_say():
    """Its plain loader is sampled by the engine as a user's is, with ``batch_size`` the global batch even under
    ``--batch_size_per_process=true`` and ``use_distributed_sampler=False``."""
    from tests.fixtures.workload import TinyClassifier, TinyData

    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[EngineLoaders(per_process=True)],
        use_distributed_sampler=False,
    )  # fmt: skip
    trainer.fit(TinyClassifier(), datamodule=TinyData(train_size=256, val_size=64, batch_size=32))
    sampler = trainer.train_dataloader.sampler
    assert isinstance(sampler, EngineSampler) and sampler.shuffle and sampler.global_batch_size == 32
    assert sampler.meaning == "global batch of one optimizer step"
