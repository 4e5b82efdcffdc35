"""Loggers and progress output: wandb offline (one run per job, continued on resume), plain progress lines."""

from pathlib import Path

import pytest

from tests.conftest import TINY

QUICK = ["--trainer.max_steps=4", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2"]


def wandb_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_wandb_offline_logs_one_run_per_job_and_continues_it_on_resume(tmp_path, run_cli):
    run_dir = tmp_path / "run"
    common = [*TINY, "--config", "configs/logger/wandb.yaml", f"--trainer.default_root_dir={run_dir}", *QUICK]
    run_cli("fit", *common, "--trainer.strategy=ddp", "--trainer.devices=2")
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    runs = wandb_runs(run_dir)
    assert len(runs) == 1, runs  # rank 1 did not start a second run
    assert runs[0].name.endswith(run_id)
    assert list(runs[0].glob("run-*.wandb"))  # the real wandb library wrote its log

    run_cli("fit", *common, "--trainer.max_steps=8", "--trainer.limit_train_batches=8", "--ckpt_path=last")
    runs = wandb_runs(run_dir)
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)  # the same wandb run, continued


def test_plain_progress_lines_when_not_on_a_terminal(tmp_path, run_cli):
    result = run_cli("fit", *TINY, *QUICK, "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path}")
    lines = [line for line in result.stdout.splitlines() if line.startswith(("val ", "done "))]
    assert lines and "val/loss=" in lines[0]
    assert "\r" not in result.stdout and "━" not in result.stdout  # no redrawn bars in log files


def test_rich_progress_bar_on_request(tmp_path, run_cli):
    result = run_cli("fit", *TINY, *QUICK, "--progress_bar=rich", f"--trainer.default_root_dir={tmp_path}")
    assert "━" in result.stdout
