"""``scripts/loader_overhead.py``, the engine's loaders beside the bare ones, run in a tiny configuration: it prints
its table, a row for each loader with the engine's handling of it (the plain loader rebuilt, LitData's kept as it
is), figures for both variants and their ratio. The figures of docs/data.md come from its full run."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.util import find_spec

import pytest

from tests.conftest import REPO, cli_env

pytestmark = pytest.mark.extended

ROW = r"\s+([\d,]+)\s+([\d,]+)\s+(\d+\.\d{3})\s+-?\d+\.\d{2}$"


def test_the_loader_benchmark_prints_its_table_in_a_tiny_configuration():
    command = [sys.executable, "scripts/loader_overhead.py", "--samples", "256", "--batch-size", "8", "--repeats", "2"]
    done = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout[done.stdout.index("256 samples of 32 values, batch 8, the loader alone") :]
    plain = re.search(r"^  DataLoader, map-style, shuffled\s+rebuilt by the engine" + ROW, table, re.MULTILINE)
    assert plain, table
    bare, engine, ratio = (float(value.replace(",", "")) for value in plain.groups())
    assert bare > 0 and engine > 0 and ratio == pytest.approx(engine / bare, abs=2e-3)
    assert "load average" in table and "spread (min-max)" in table
    if find_spec("litdata") is not None:
        assert re.search(r"^  LitData StreamingDataLoader\s+kept as it is" + ROW, table, re.MULTILINE), table
