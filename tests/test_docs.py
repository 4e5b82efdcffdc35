"""``python -m multigpu.docs``: the engine's documentation, installed with it, is this repository's ``docs/``."""

from __future__ import annotations

import subprocess
import sys

from multigpu import docs
from tests.conftest import REPO


def test_it_lists_the_pages_of_docs() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "multigpu.docs"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert [line.rsplit("/", 1)[-1] for line in listed] == sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert "engine.md" in {path.name for path in docs.files()}
    assert all(path.read_bytes() == (REPO / "docs" / path.name).read_bytes() for path in docs.files())
