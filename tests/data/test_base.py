"""GlobalBatchDataModule (multigpu/data/base.py) outside a Trainer (the examples' data modules are tested in
tests/examples/)."""

from torch.utils.data import DataLoader

from tests.fixtures.workload import TinyData


def test_train_loader_outside_a_trainer_uses_the_whole_global_batch():
    dm = TinyData(train_size=256, val_size=64, batch_size=32)
    dm.setup()
    loader = dm.train_dataloader()
    features, labels = next(iter(loader))
    assert features.shape == (32, 16) and labels.shape == (32,) and len(loader) == 8
    assert type(loader) is DataLoader  # a plain one: the engine samples and resumes it as a user's own


def test_a_drawn_32_bit_seed_seeds_the_loaders_generator():
    """``seed_everything: true`` draws a seed below 2**32: every epoch's and rank's loader seed still fits the 63 bits
    ``torch.Generator.manual_seed`` takes, and the pairs stay distinct."""
    import torch

    from multigpu.data.base import loader_seed

    seeds = {loader_seed(2**32 - 1, epoch, rank) for epoch in range(3) for rank in range(4)}
    assert len(seeds) == 12
    for seed in seeds:
        torch.Generator().manual_seed(seed)  # raised "Overflow when unpacking long long" before
    assert loader_seed(42, 1, 2) == (42 * 1_000_003 + 1) * 65_537 + 2  # small seeds: unchanged


def test_under_a_plain_trainer_the_sampler_shares_the_global_batch_and_under_the_engine_the_engine_does():
    import lightning as L

    from multigpu.data.engine_loaders import EngineLoaders
    from multigpu.data.sampling import GlobalBatchSampler

    for callbacks, shared_by_sampler in (([], True), ([EngineLoaders()], False)):
        data = TinyData(batch_size=32, train_size=256)
        data.trainer = L.Trainer(accelerator="cpu", devices=1, callbacks=callbacks, logger=False)
        data.setup("fit")
        loader = data.train_dataloader()
        assert isinstance(loader.sampler, GlobalBatchSampler) is shared_by_sampler
        assert loader.batch_size == 32  # one process: the micro-batch is the global batch
