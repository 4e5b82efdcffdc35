"""Both workloads learn; a stopped and resumed run ends with the same weights as an uninterrupted one."""

import pytest
import torch

from src.cli import main
from tests.conftest import TINY_IMAGE, load_state, read_metrics

GPT = [
    "--config", "configs/experiment/gpt.yaml", "--trainer.accelerator=cpu", "--progress_bar=none",
    "--model.init_args.n_layer=2", "--model.init_args.n_embd=64", "--model.init_args.block_size=64",
    "--data.init_args.block_size=64", "--data.init_args.corpus_chars=120000",
    "--trainer.max_steps=60", "--model.init_args.lr_scheduler.init_args.T_max=60", "--trainer.val_check_interval=20",
    "--data.init_args.batch_size=16",
]  # fmt: skip


@pytest.mark.slow
def test_language_model_validation_loss_falls_well_below_its_start(tmp_path):
    run_dir = tmp_path / "gpt"
    main(["validate", *GPT, f"--trainer.default_root_dir={run_dir}"])  # the untrained model
    start = float(read_metrics(run_dir, version=0)[-1]["val/loss"])
    main(["fit", *GPT, f"--trainer.default_root_dir={run_dir}"])
    losses = [float(r["val/loss"]) for r in read_metrics(run_dir, version=1) if r.get("val/loss")]
    assert len(losses) == 3
    assert start > 5.0  # ~ln(256): untrained byte predictions are near uniform
    assert losses[-1] < 0.5 * start and losses[-1] < losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "64-true"])
def test_stopped_and_resumed_run_ends_with_the_same_weights(precision, tmp_path):
    """Stop at step 11 (mid-epoch, via the preemption signal), resume, compare at step 40 (2.5 epochs): exact."""
    common = [*TINY_IMAGE, f"--trainer.precision={precision}", "--trainer.max_steps=40", "--progress_bar=none",
              "--trainer.val_check_interval=8"]  # fmt: skip
    main(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'straight'}"])
    stopped = tmp_path / "stopped"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *common, f"--trainer.default_root_dir={stopped}",
              "--trainer.callbacks+=tests.helpers.SignalAtStep", "--trainer.callbacks.step=11"])  # fmt: skip
    assert exit_info.value.code == 75
    assert torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 11
    main(["fit", *common, f"--trainer.default_root_dir={stopped}", "--ckpt_path=last"])
    straight = load_state(tmp_path / "straight" / "checkpoints" / "last.ckpt")
    resumed = load_state(stopped / "checkpoints" / "last.ckpt")
    for key in straight:  # tolerance: none, the same operations on the same data in the same order
        assert torch.equal(straight[key], resumed[key]), key
