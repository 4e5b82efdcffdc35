"""GPU checks of ``fsdp2`` and ``tensor_parallel`` (NCCL, bf16): run by ``scripts/gpu_check.sh`` on a GPU machine.

The GPT trains a few steps on every GPU the machine has (at most 2) in ``bf16-mixed`` and ``bf16-true``, writes a
sharded checkpoint, and a consolidated copy of it validates on one GPU with the loss the run logged.
"""

from __future__ import annotations

import pytest
import torch

from multigpu.checkpoints.consolidate import consolidate
from multigpu.checkpoints.sharded import is_sharded_checkpoint
from tests.conftest import read_metrics
from tests.examples.conftest import TINY_GPT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with: python -m pytest -m gpu)"),
]


@pytest.mark.parametrize("strategy", ["fsdp2", "tensor_parallel"])
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_model_parallel_strategies_train_on_gpus(strategy, precision, run_cli, tmp_path):
    devices = min(2, torch.cuda.device_count())
    common = [*TINY_GPT, "--trainer.accelerator=gpu", f"--trainer.precision={precision}"]
    run_cli(
        "fit", *common, f"--trainer.strategy={strategy}", f"--trainer.devices={devices}", "--trainer.max_steps=6",
        "--trainer.val_check_interval=6", "--trainer.limit_val_batches=2", f"--trainer.default_root_dir={tmp_path}",
    )  # fmt: skip
    sharded = tmp_path / "checkpoints" / "last.ckpt"
    assert is_sharded_checkpoint(sharded)
    trained = float([r for r in read_metrics(tmp_path) if r.get("val/loss")][-1]["val/loss"])
    assert trained < 5.5  # ln(256) = 5.55: it learned something
    whole = consolidate(sharded, tmp_path / "whole.ckpt")
    check = tmp_path / "check"
    run_cli(
        "validate", *common, "--trainer.devices=1", "--trainer.limit_val_batches=2", f"--ckpt_path={whole}",
        f"--trainer.default_root_dir={check}",
    )  # fmt: skip
    assert float(read_metrics(check)[-1]["val/loss"]) == pytest.approx(trained, rel=2e-2)  # bf16 rounding
