"""Loggers and progress output: wandb offline (one run per job, continued on resume), plain progress lines.

One job is shared by the tests: a ddp run with wandb (its output not on a terminal: plain progress lines), then
its resume in one process with the rich progress bar asked for.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tests import prewarmed
from tests.conftest import REPO, TINY, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_logging")]

QUICK = ["--trainer.max_steps=4", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2"]


def wandb_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    """The run directory, and after each of the two starts its output and the wandb runs it left."""
    run_dir = tmp_path_factory.mktemp("wandb") / "run"
    common = [*TINY, "--config", "configs/logger/wandb.yaml", f"--trainer.default_root_dir={run_dir}", *QUICK]

    def cli(*args: str) -> subprocess.CompletedProcess:
        result = prewarmed.run([sys.executable, "-m", "tests.cli", "fit", *common, *args], cwd=REPO, env=cli_env(),
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert result.returncode == 0, result.stderr[-6000:]
        return result

    first = cli("--trainer.strategy=ddp", "--trainer.devices=2")
    after_first = wandb_runs(run_dir)
    resumed = cli("--trainer.max_steps=8", "--trainer.limit_train_batches=8", "--ckpt_path=last", "--progress_bar=rich")
    return {"run_dir": run_dir, "first": first, "after_first": after_first, "resumed": resumed}


def test_wandb_offline_logs_one_run_per_job_and_continues_it_on_resume(job):
    run_id = (job["run_dir"] / "wandb_run_id").read_text().strip()
    runs = job["after_first"]
    assert len(runs) == 1, runs  # rank 1 did not start a second run
    assert runs[0].name.endswith(run_id)
    assert list(runs[0].glob("run-*.wandb"))  # the real wandb library wrote its log
    runs = wandb_runs(job["run_dir"])
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)  # the same wandb run, continued


def test_plain_progress_lines_when_not_on_a_terminal(job):
    stdout = job["first"].stdout
    lines = [line for line in stdout.splitlines() if line.startswith(("val ", "done "))]
    assert lines and "val/loss=" in lines[0]
    assert "\r" not in stdout and "━" not in stdout  # no redrawn bars in log files


def test_rich_progress_bar_on_request(job):
    assert "━" in job["resumed"].stdout
