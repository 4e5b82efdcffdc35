"""The benchmark's rows that start processes, run one after another in the order ``python -m benchmarks --quick``
runs them (the template's ddp, then bare Lightning's and plain PyTorch's DDP after the one-device
rows): each ends with exit status 0 and every rank's figures, whatever the rows before it left behind. They train the
benchmark's built-in workloads, the examples."""

from __future__ import annotations

import json
import sys

import pytest

from tests import prewarmed
from tests.conftest import REPO, cli_env


@pytest.mark.slow
def test_the_rows_that_start_processes_complete_in_the_benchmarks_order(tmp_path):
    command = [sys.executable, "-m", "benchmarks", "--quick", "--strategies=ddp", "--steps=1"]
    command += ["--warmup=1", "--startup-repeats=0", "--no-plots", f"--out={tmp_path}"]
    result = prewarmed.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    order = [row["strategy"] for row in rows]
    # the order they ran in: the template's rows, then each baseline's one-device row before its DDP row
    assert order == ["single", "ddp", "bare-lightning", "bare-lightning-ddp", "plain-loop", "plain-ddp"]
    for row in rows:
        assert row["status"] == "ok" and row["repeats_ok"] == 1, row
    for log in (tmp_path / "runs").glob("*/output.log"):
        assert "terminate called" not in log.read_text(), log
