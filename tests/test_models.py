"""Models: shapes, causality, FLOP counts, checkpoints."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from src.models import CausalLanguageModel, ImageClassifier


def test_image_classifier_outputs_logits_per_class():
    model = ImageClassifier(num_classes=7, widths=(8, 16))
    assert model(torch.randn(5, 3, 32, 32)).shape == (5, 7)


def test_gpt_is_causal():
    torch.manual_seed(0)
    model = CausalLanguageModel(n_layer=2, n_head=2, n_embd=16, block_size=16).eval()
    tokens = torch.randint(0, 256, (2, 16))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256
    a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)  # the past does not see the future
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_gpt_rejects_sequences_longer_than_its_block():
    model = CausalLanguageModel(n_layer=1, n_head=1, n_embd=8, block_size=8)
    with pytest.raises(ValueError, match="block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_gpt_flops_follow_the_parameter_count():
    model = CausalLanguageModel(n_layer=2, n_head=2, n_embd=32, block_size=64)
    non_embedding = sum(p.numel() for p in model.parameters()) - 64 * 32
    assert model.flops_per_token() == 6 * non_embedding + 12 * 2 * 32 * 64


def test_gpt_generates_the_requested_number_of_tokens():
    model = CausalLanguageModel(n_layer=1, n_head=1, n_embd=8, block_size=8)
    out = model.generate(torch.zeros(2, 3, dtype=torch.long), max_new_tokens=10, temperature=0)
    assert out.shape == (2, 13)


def test_checkpoint_reloads_with_its_hyperparameters(tmp_path):
    model = ImageClassifier(widths=(8, 16), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    data = TensorDataset(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    trainer.fit(model, train_dataloaders=DataLoader(data, batch_size=8))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    restored = ImageClassifier.load_from_checkpoint(tmp_path / "m.ckpt")
    assert restored.hparams.widths == (8, 16)
    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_weighted_mean_weights_its_updates_and_keeps_several_means():
    from src.models.base import WeightedMean

    mean, pair = WeightedMean(), WeightedMean(shape=(2,))
    for value, count in ((2.0, 3), (4.0, 1)):
        mean.update(torch.tensor(value, dtype=torch.float64), weight=count)
        pair.update(torch.tensor([value, -value]), weight=count)
    assert mean.compute().item() == pytest.approx(2.5)
    assert pair.compute().tolist() == pytest.approx([2.5, -2.5])


def test_best_validation_accuracy_continues_from_the_checkpoint(tmp_path):
    from src.cli import main
    from tests.conftest import TINY_IMAGE, read_metrics

    common = [*TINY_IMAGE, f"--trainer.default_root_dir={tmp_path}", "--progress_bar=none",
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
    from src.cli import main

    model = ImageClassifier(
        widths=(8, 16),
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max"),
    )
    config = model.configure_optimizers()["lr_scheduler"]
    assert config["interval"] == "epoch" and config["monitor"] == "val/acc"
    # through the command line, with a monitor no model logs: training goes on (Lightning warns per epoch)
    from tests.conftest import TINY_IMAGE

    plateau = ["--model.lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau", "--model.lr_scheduler_monitor=val/x"]
    main(["fit", *TINY_IMAGE, f"--trainer.default_root_dir={tmp_path}", "--progress_bar=none", *plateau,
          "--trainer.max_epochs=2", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"])  # fmt: skip
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
