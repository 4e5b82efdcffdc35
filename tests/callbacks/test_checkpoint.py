"""``RunCheckpoint``: ``last.ckpt`` at every validation whatever ``--checkpoint.monitor`` names, so that a crash
loses at most the steps since the last validation."""

from __future__ import annotations

import pytest
import torch

from src.cli import main

#: a user's model that logs ``val/mse``, not the default monitor ``val/loss``; 16 optimizer steps per epoch
REGRESSION = [
    "--trainer.accelerator=cpu",
    "--trainer.enable_model_summary=false",
    "--progress_bar=none",
    "--model=tests.zoo.regression.Regressor",
    "--data=tests.zoo.regression.GlobalRegressionData",
    "--data.init_args.batch_size=4",
    "--trainer.max_epochs=2",
]


def test_a_run_whose_model_does_not_log_the_monitor_keeps_last_ckpt_of_its_last_validation(tmp_path):
    run_dir = tmp_path / "run"
    args = ["fit", *REGRESSION, f"--trainer.default_root_dir={run_dir}"]
    crash = ["--trainer.callbacks+=tests.helpers.CrashAtStep", "--trainer.callbacks.step=20"]
    with (
        pytest.warns(UserWarning, match="--checkpoint.monitor=val/loss is not logged by this model"),
        pytest.raises(RuntimeError, match="crashed at step 20"),
    ):
        main([*args, *crash])
    last = run_dir / "checkpoints" / "last.ckpt"
    assert [p.name for p in last.parent.iterdir()] == ["last.ckpt"]  # no best-*.ckpt without the metric
    assert torch.load(last, weights_only=True)["global_step"] == 16  # the first epoch's validation
    main([*args, "--ckpt_path=last"])  # the crashed run resumes from it and finishes
    assert torch.load(last, weights_only=True)["global_step"] == 32
