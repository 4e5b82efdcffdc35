"""The template's model base (multigpu/models/base.py): hyperparameters in checkpoints, metrics, schedulers."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.fixtures.workload import TinyClassifier


def test_checkpoint_reloads_with_its_hyperparameters(tmp_path):
    model = TinyClassifier(hidden=8, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    data = TensorDataset(torch.randn(8, 16), torch.randint(0, 4, (8,)))
    trainer.fit(model, train_dataloaders=DataLoader(data, batch_size=8))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    restored = TinyClassifier.load_from_checkpoint(tmp_path / "m.ckpt")
    assert restored.hparams.hidden == 8
    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_weighted_mean_weights_its_updates_and_keeps_several_means():
    from multigpu.models.base import WeightedMean

    mean, pair = WeightedMean(), WeightedMean(shape=(2,))
    for value, count in ((2.0, 3), (4.0, 1)):
        mean.update(torch.tensor(value, dtype=torch.float64), weight=count)
        pair.update(torch.tensor([value, -value]), weight=count)
    assert mean.compute().item() == pytest.approx(2.5)
    assert pair.compute().tolist() == pytest.approx([2.5, -2.5])


def test_best_validation_accuracy_continues_from_the_checkpoint(tmp_path):
    from tests.cli import main
    from tests.conftest import TINY, read_metrics

    common = [*TINY, f"--trainer.default_root_dir={tmp_path}", "--progress_bar=none",
              "--trainer.limit_val_batches=2", "--trainer.val_check_interval=3"]  # fmt: skip
    main(["fit", *common, "--trainer.max_steps=6"])
    first = [float(r["val/acc"]) for r in read_metrics(tmp_path, 0) if r.get("val/acc")]
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert state["val_acc_best.max_value"].item() == pytest.approx(max(first))  # saved with the weights
    main(["fit", *common, "--trainer.max_steps=9", "--ckpt_path=last"])
    resumed = [r for r in read_metrics(tmp_path, 1) if r.get("val/acc")]
    assert len(resumed) == 1
    # the best so far covers the first run's validations too, not only the resumed one
    assert float(resumed[0]["val/acc_best"]) == pytest.approx(max([*first, float(resumed[0]["val/acc"])]))


def test_plateau_scheduler_steps_per_epoch_on_a_metric_validation_logs(tmp_path):
    from tests.cli import main

    model = TinyClassifier(
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max"),
    )
    config = model.configure_optimizers()["lr_scheduler"]
    assert config["interval"] == "epoch" and config["monitor"] == "val/acc"
    # through the command line, with a monitor no model logs: training goes on (Lightning warns per epoch)
    from tests.conftest import TINY

    plateau = ["--model.lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau", "--model.lr_scheduler_monitor=val/x"]
    main(["fit", *TINY, f"--trainer.default_root_dir={tmp_path}", "--progress_bar=none", *plateau,
          "--trainer.max_epochs=2", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"])  # fmt: skip
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
