"""A run stopped on release 1.1.0 resumes on this release and ends as its uninterrupted run ended on 1.1.0, bit for
bit, resumed as a user resumes it, with ``--config`` the ``config.yaml`` 1.1.0 saved (class paths under ``multigpu.``
included) and ``--ckpt_path=last``: the checkpoint's entries (the loader position, random state, checkpoint callback)
are read as 1.1.0 wrote them.

``tests/fixtures/release_1_1/`` holds what release 1.1.0 (commit 0a9882c, with this repository's ``tests/cli.py``
and ``tests/configs/default.yaml`` beside it) wrote for ``python -m tests.cli fit`` with ``ARGS``: ``stopped/``, the
run directory of a run sent SIGTERM after step 2 (``multigpu.testing.SignalAtStep``), and ``uninterrupted.ckpt``, the
``last.ckpt`` of the same run never stopped."""

from __future__ import annotations

import shutil
import subprocess
import sys

import torch

from multigpu.testing import differences
from tests.conftest import REPO, cli_env

FIXTURE = REPO / "tests" / "fixtures" / "release_1_1"
ARGS = [
    "--seed_everything=1234", "--trainer.max_epochs=-1", "--trainer.limit_val_batches=2",
    "--trainer.log_every_n_steps=1", "--trainer.enable_model_summary=false", "--trainer.max_steps=6",
    "--model=tests.fixtures.workload.TinyClassifier", "--model.init_args.dropout=0.1",
    "--data=tests.fixtures.workload.TinyData", "--trainer.accelerator=cpu", "--progress_bar=none",
    "--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.init_args.name=logs",
]  # fmt: skip
COMPARED = ("global_step", "state_dict", "optimizer_states", "lr_schedulers")


def test_a_run_stopped_on_release_1_1_resumes_here_and_ends_as_it_would_have_on_1_1(tmp_path):
    run_dir = tmp_path / "stopped"
    shutil.copytree(FIXTURE / "stopped", run_dir)
    stopped = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert stopped["global_step"] == 2
    resumed = subprocess.run(
        [sys.executable, "-m", "tests.cli", "fit", f"--config={run_dir / 'logs' / 'version_0' / 'config.yaml'}",
         "--ckpt_path=last", f"--trainer.default_root_dir={run_dir}"],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    got = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    expected = torch.load(FIXTURE / "uninterrupted.ckpt", map_location="cpu", weights_only=True)
    assert got["global_step"] == 6
    found = differences({key: expected[key] for key in COMPARED}, {key: got[key] for key in COMPARED})
    assert not found, f"the resumed run differs from 1.1.0's uninterrupted one: {found[:5]}"
