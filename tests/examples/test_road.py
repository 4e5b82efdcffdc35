"""The reading of a run (docs/engine.md, "Reading a run"): the eight files it names are ``scripts/road.py``'s
``READING``, in its order, each is on the road a fit of the tests' tiny workload takes to its first
``training_step``, and every step of the run's construction is taken in one of them."""

from __future__ import annotations

import re
import sys

import pytest

from tests import prewarmed
from tests.conftest import REPO, cli_env

sys.path.insert(0, str(REPO / "scripts"))
from road import READING  # scripts/ is no package: its folder on the path


@pytest.mark.extended
def test_the_files_a_reader_opens_are_the_pages_list_and_each_runs_on_the_way_to_the_first_step():
    page = (REPO / "docs" / "engine.md").read_text()
    section = page[page.index("## Reading a run") : page.index("## What runs around your training step")]
    assert re.findall(r"^\d+\. `([^`]+)`", section, re.MULTILINE) == READING
    assert len(READING) <= 8 and all((REPO / path).is_file() for path in READING)
    result = prewarmed.run(
        [sys.executable, "scripts/road.py"], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "8 files a reader opens (docs/engine.md, Reading a run); not on the road: none" in result.stdout
    assert "steps outside the files a reader opens: none" in result.stdout
    ran = re.findall(r"^\s+\d+\s+(multigpu/\S+)\s+\d+ functions$", result.stdout, re.MULTILINE)
    assert set(READING) - {"src/cli.py"} <= set(ran), ran  # src/cli.py runs as it is imported
