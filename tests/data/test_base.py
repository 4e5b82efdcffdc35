"""GlobalBatchDataModule (multigpu/data/base.py) outside a Trainer (the examples' data modules are tested in
tests/examples/)."""

from tests.fixtures.workload import TinyData


def test_train_loader_outside_a_trainer_uses_the_whole_global_batch():
    dm = TinyData(train_size=256, val_size=64, batch_size=32)
    dm.setup()
    loader = dm.train_dataloader()
    features, labels = next(iter(loader))
    assert features.shape == (32, 16) and labels.shape == (32,) and len(loader) == 8
    assert loader.state_dict() == {}  # no trainer: nothing to resume
