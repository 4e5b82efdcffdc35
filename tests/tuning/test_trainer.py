"""``python -m tests.cli tune`` (multigpu/tuning/trainer.py): the largest micro-batch under a memory limit, a learning
rate,
a config (the batch and learning-rate arithmetic: tests/tuning/test_scaling.py)."""

from __future__ import annotations

import json

import lightning as L
import yaml
from torch import Tensor

from multigpu.checkpoints.files import AtomicCheckpointIO
from multigpu.tuning import Trainer as TuningTrainer
from tests.cli import CLI, main
from tests.conftest import TINY, read_metrics
from tests.fixtures.workload import TinyClassifier


class MemoryLimitedClassifier(TinyClassifier):
    """The tests' classifier on a simulated device that holds ``memory_limit`` samples per training step: a larger
    micro-batch raises the error CUDA raises when it runs out of memory (Lightning tells it by its message)."""

    def __init__(self, memory_limit: int = 20, **kwargs) -> None:
        super().__init__(**kwargs)
        self.memory_limit = memory_limit

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if len(batch[0]) > self.memory_limit:
            raise RuntimeError(f"CUDA out of memory. Tried to hold {len(batch[0])} samples (simulated)")
        return super().training_step(batch, batch_idx)


LIMITED = [
    *TINY,
    "--model=tests.tuning.test_trainer.MemoryLimitedClassifier",
    "--model.init_args.hidden=24",
    "--model.init_args.memory_limit=20",
]


def test_tune_under_ddp_finds_the_largest_power_of_two_that_fits_and_its_config_trains(tmp_path, capsys):
    run_dir = tmp_path / "tune"
    main(["tune", *LIMITED, "--trainer.strategy=ddp", "--trainer.devices=2", "--steps_per_trial=1",
          "--lr_find_steps=15", f"--trainer.default_root_dir={run_dir}"])  # fmt: skip
    printed = capsys.readouterr().out
    # 16 fits under the limit of 20 samples, 32 does not; the global batch is 16 x 2 processes
    assert "micro-batch per device: 16 (power search" in printed
    assert "global batch: 32 = 16 x 2 device(s) x 1 accumulation" in printed
    tuned_path = run_dir / "tuned.yaml"
    assert f"--config {tuned_path}" in printed
    tuned = yaml.safe_load(tuned_path.read_text())
    assert tuned["data"] == {"init_args": {"batch_size": 32}}
    lr = tuned["model"]["init_args"]["optimizer"]["init_args"]["lr"]
    assert 1e-8 < lr < 1.0 and f"learning rate: {lr:.3g} = LR finder's suggestion at batch 16" in printed
    assert tuned_path.read_text().startswith("# Written by `python -m tests.cli tune`:\n# measured on one cpu device")
    assert not list(run_dir.rglob("*.ckpt"))  # the finders' own checkpoints went to a scratch folder

    # the config trains: micro-batches of 16 per step of 32 (here by accumulation on one process, as ddp would)
    fit_dir = tmp_path / "fit"
    main(["fit", *LIMITED, "--trainer.accumulate_grad_batches=2", "--trainer.max_steps=2",
          "--trainer.limit_val_batches=1", "--progress_bar=none", f"--trainer.default_root_dir={fit_dir}",
          "--config", str(tuned_path)])  # fmt: skip
    plan = json.loads((fit_dir / "logs" / "version_0" / "run_plan.json").read_text())
    assert plan["global_batch"] == 32 and plan["micro_batch_per_process"] == 16
    resolved = yaml.safe_load((fit_dir / "logs" / "version_0" / "config.yaml").read_text())
    assert resolved["model"]["init_args"]["optimizer"]["init_args"]["lr"] == lr
    assert resolved["model"]["init_args"]["hidden"] == 24  # the other options are kept
    assert (fit_dir / "checkpoints" / "last.ckpt").is_file()

    # the suggested learning rate trains: over the same 12 steps it lowers the loss more than a 100x smaller one
    def loss_drop(lr: float, name: str) -> float:
        run = tmp_path / name
        main(["fit", *LIMITED, "--config", str(tuned_path), f"--model.init_args.optimizer.init_args.lr={lr}",
              "--trainer.accumulate_grad_batches=2", "--trainer.max_steps=12", "--trainer.log_every_n_steps=1",
              "--trainer.limit_val_batches=0", "--progress_bar=none", f"--trainer.default_root_dir={run}"])  # fmt: skip
        losses = [float(row["train/loss"]) for row in read_metrics(run) if row.get("train/loss")]
        return losses[0] - losses[-1]

    assert loss_drop(lr, "suggested") > 2 * max(loss_drop(lr / 100, "smaller"), 0.0) > 0


def test_binsearch_bisects_to_the_limit_and_keeps_lightnings_margin_without_a_learning_rate(tmp_path, capsys):
    config = tmp_path / "tuned.yaml"
    main(["tune", *LIMITED, "--batch_size_mode=binsearch", "--steps_per_trial=1", "--lr_find_steps=0",
          f"--tuned_config={config}", f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    # 16 fits, 32 does not; bisecting finds 20, the limit itself, and Lightning keeps 5% below it: int(20 * 0.95)
    assert yaml.safe_load(config.read_text()) == {"data": {"init_args": {"batch_size": 19}}}
    assert "learning rate: not measured" in capsys.readouterr().out


def test_only_tune_builds_the_trainer_with_a_tune_method(tmp_path):
    fit = CLI(["fit", *TINY, "--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path / 'fit'}"])
    assert type(fit.trainer) is L.Trainer and fit.trainer.global_step == 1
    tune = CLI(["tune", *LIMITED, "--steps_per_trial=1", "--lr_find_steps=0", "--max_batch_size=8",
                        f"--trainer.default_root_dir={tmp_path / 'tune'}"])  # fmt: skip
    assert type(tune.trainer) is TuningTrainer and (tmp_path / "tune" / "tuned.yaml").is_file()


def test_the_finders_read_their_own_checkpoint_back_weights_only(tmp_path):
    """Lightning's finders save the initial weights and restore them through the checkpoint plugin: the template's,
    which reads with weights_only (multigpu/checkpoints/safe.py)."""
    finder = TuningTrainer(accelerator="cpu", devices=1, logger=False)._single_device_trainer(str(tmp_path))
    assert isinstance(finder.strategy.checkpoint_io, AtomicCheckpointIO)
