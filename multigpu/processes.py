"""The processes a run started: waiting for them to exit, and ending the ones that do not."""

from __future__ import annotations

import subprocess
import time


def wait_for_exit(processes: list[subprocess.Popen], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` in all for ``processes`` to exit; kill the ones still running then."""
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
