"""A NaN loss stops training with one message and leaves the last good checkpoint intact (faults/nan_guard.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from multigpu.checkpoints.background import wait_for_checkpoints
from multigpu.faults.nan_guard import NonFiniteLoss
from tests.cli import main
from tests.conftest import TINY, load_state

CORRUPT_STEP = 12  # the 12th optimizer step, in the second epoch: the first ends with a checkpoint at step 8


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class NaNInputsAtStep(Callback):
    """Fills the inputs of optimizer step ``step`` (counting from 1) with NaN; records last.ckpt's hash then."""

    seen_digest: str | None = None  # the CLI builds the instance, so the test reads the class

    def __init__(self, step: int, rank: int | None = None) -> None:
        self.step = step
        self.rank = rank  # only this rank's batch (None: every rank's)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step + 1 == self.step and self.rank in (None, trainer.global_rank):
            batch[0].fill_(float("nan"))
            wait_for_checkpoints(trainer)  # the step-8 save may still be writing in the background
            last = Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"
            NaNInputsAtStep.seen_digest = digest(last) if last.is_file() else None


@pytest.mark.parametrize(("check_every", "stopped_after"), [(0, CORRUPT_STEP - 1), (100, 16)])
def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(check_every, stopped_after, tmp_path, capsys):
    """0: read every step on a CPU, stops before the step is applied; 100: read only when a checkpoint is saved."""
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        main([
            "fit", *TINY, "--trainer.limit_train_batches=8", "--trainer.limit_val_batches=1",
            "--trainer.max_epochs=2", "--progress_bar=none", f"--nan_guard.check_every_n_steps={check_every}",
            "--trainer.callbacks+=tests.faults.test_nan_guard.NaNInputsAtStep",
            f"--trainer.callbacks.step={CORRUPT_STEP}",
            f"--trainer.default_root_dir={run_dir}",
        ])  # fmt: skip
    last = run_dir / "checkpoints" / "last.ckpt"
    assert stop.value.code == NonFiniteLoss.exit_code == 65  # not 75: a scheduler must not requeue it
    message = capsys.readouterr().err
    assert "error: the training loss was NaN" in message and "Traceback" not in message
    assert f"NaN or infinite at optimizer step {CORRUPT_STEP} " in message
    assert f"after {stopped_after} applied steps" in message and str(last) in message and "Fix:" in message
    assert digest(last) == NaNInputsAtStep.seen_digest  # not rewritten after the bad step
    checkpoint = torch.load(last, weights_only=False)
    assert checkpoint["global_step"] == 8
    assert all(torch.isfinite(t).all() for t in load_state(last).values() if t.is_floating_point())


def test_training_through_nan_with_the_guard_switched_off(tmp_path):
    run_dir = tmp_path / "run"
    main([
        "fit", *TINY, "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=1",
        "--trainer.max_epochs=1", "--progress_bar=none", "--callbacks_off=[nan_guard]",
        "--trainer.callbacks+=tests.faults.test_nan_guard.NaNInputsAtStep", "--trainer.callbacks.step=2",
        f"--trainer.default_root_dir={run_dir}",
    ])  # fmt: skip
    weights = load_state(run_dir / "checkpoints" / "last.ckpt")
    assert any(torch.isnan(t).any() for t in weights.values() if t.is_floating_point())


def test_nan_on_one_ddp_rank_stops_every_rank_at_the_next_logging_step(tmp_path, run_cli):
    """Under ddp the ranks agree on the record every log_every_n_steps (not every step: a blocking all-reduce)."""
    run_dir = tmp_path / "run"
    result = run_cli(
        "fit", *TINY, "--config=configs/trainer/ddp_cpu.yaml", "--trainer.limit_train_batches=8",
        "--trainer.limit_val_batches=1", "--trainer.max_epochs=2", "--trainer.log_every_n_steps=5",
        "--progress_bar=none", "--trainer.callbacks+=tests.faults.test_nan_guard.NaNInputsAtStep",
        f"--trainer.callbacks.step={CORRUPT_STEP}", "--trainer.callbacks.rank=1",
        f"--trainer.default_root_dir={run_dir}", check=False, timeout=300,
    )  # fmt: skip
    last = run_dir / "checkpoints" / "last.ckpt"
    assert result.returncode == NonFiniteLoss.exit_code, result.stderr[-3000:]
    assert result.stderr.count("error: the training loss was NaN") == 1 and "Traceback" not in result.stderr
    # found by both ranks at step 15, the first multiple of 5 after the bad step, which only rank 1 saw
    assert f"NaN or infinite at optimizer step {CORRUPT_STEP} " in result.stderr
    assert "after 15 applied steps" in result.stderr and str(last) in result.stderr
    assert torch.load(last, weights_only=False)["global_step"] == 8
    assert all(torch.isfinite(t).all() for t in load_state(last).values() if t.is_floating_point())
