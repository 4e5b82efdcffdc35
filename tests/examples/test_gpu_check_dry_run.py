"""scripts/gpu_check.sh, the GPU check, run dry on this CPU (``GPU_CHECK_DRY_RUN=1``): every part starts, with
tiny sizes, and writes its outputs, so a mistake shows before a GPU runs it. Its parts train the examples
(the benchmark's built-in workloads, configs/experiment/gpt_gpu.yaml) through ``python -m src.cli`` (the rest of the
check: tests/test_gpu_check.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile

import pytest

from benchmarks.__main__ import parse_args, plan
from tests.conftest import REPO
from tests.test_gpu_check import PARTS


@pytest.mark.slow
@pytest.mark.extended
def test_the_dry_run_starts_every_part_and_writes_its_outputs(tmp_path):
    out = tmp_path / "check"
    env = {**os.environ, "GPU_CHECK_DRY_RUN": "1", "PYTHON": sys.executable, "GPU_CHECK_SITE": str(tmp_path / "site"),
           "GPU_CHECK_SCRATCH": str(tmp_path / "runs")}  # fmt: skip
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=850
    )
    assert result.returncode == 0, result.stdout[-4000:]
    summary = (out / "summary.txt").read_text().splitlines()
    names = [line.split()[0] for line in summary]  # the side-by-side parts in the order they ended
    assert names[0] == "setup" and sorted(names[1:4]) == sorted(PARTS[1:4]) and names[4:] == PARTS[4:]
    assert all(" rc=0 " in line for line in summary)
    assert "dry run: 1" in (out / "machine.txt").read_text() and "jsonargparse" in (out / "machine.txt").read_text()

    assert "skipped" in (out / "gpu_tests.log").read_text()  # collected and run: on a CPU every GPU test skips
    users = sorted((out / "users").glob("*.json"))
    assert [p.stem.split("-", 2)[1] for p in users] == ["regression", "gan"]  # one precision each on a CPU
    assert all(json.loads(p.read_text()) for p in users)

    syncs = [json.loads(p.read_text()) for p in sorted((out / "syncs").glob("*.json"))]
    assert [s["strategy"] for s in syncs] == ["single", "dp", "ddp", "single"]  # 16-mixed is bf16-mixed on a CPU
    assert all(s["mode"] == "cpu-stand-in" and s["steps"] == 2 and s["total"] > 0 for s in syncs)
    assert "ProgressBar" in " ".join(syncs[0]["callbacks"]) and "RunCheckpoint" in syncs[0]["callbacks"]

    rows = json.loads((out / "bench_gpt" / "results.json").read_text())["rows"]
    assert {row["strategy"] for row in rows} >= {"single", "plain-loop"}
    assert "planned" in (out / "bench_image.log").read_text()  # the same function; trained by the quick benchmark test
    for workload in ("gpt", "image"):
        # the rows the GPU run asks for, planned from the same options (the dry run trains three of them)
        real = (out / f"bench_{workload}.args").read_text().split("\n")[:-1]
        rows, skipped = plan(parse_args(real), "cpu", {workload: 32})
        assert not skipped
        assert {(r.strategy, r.precision) for r in rows} == {
            (s, p) for s in ("single", "dp", "bare-lightning", "plain-loop") for p in ("32-true", "bf16-mixed")
        }

    mfu = [json.loads(p.read_text()) for p in sorted((out / "mfu").glob("*.json"))]
    assert len(mfu) == 2 and all(m["perf/tokens_per_s"] > 0 for m in mfu)
    ranges = (out / "nvtx" / "ranges.txt").read_text()  # counted with the stand-in: the GPU run counts or uses nsys
    assert (
        re.search(r"^step N \(all\) +10 ", ranges, re.MULTILINE)
        and "ranges left open: 0" in ranges
        and "optimizer" in ranges
    )
    stall = (out / "stall.log").read_text()
    assert ("skipped" in stall) != (REPO / "scripts" / "checkpoint_stall.py").exists()
    # the runs' folders (checkpoints) stay out of the outputs, which come back as one archive
    assert not list(out.rglob("*.ckpt")) and list((tmp_path / "runs").rglob("*.ckpt"))
    with tarfile.open(out / "outputs.tgz") as archive:
        names = set(archive.getnames())
    assert {"./summary.txt", "./console.log", "./bench_gpt/results.md", "./syncs"} <= names
