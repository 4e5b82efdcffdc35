"""Whether a process of a run still runs (the one rule of the run directory's lock and the ranks' stack dumps)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

HEARTBEAT_S = 30.0
PF_EXITING = 0x4


def start_if_running(stat: str) -> str | None:
    """The start time a ``/proc/<pid>/stat`` line gives; None once exiting, when a killed rank's peer sees it go."""
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    exiting = fields[0] in ("Z", "X") or int(fields[6]) & PF_EXITING
    return None if exiting else fields[19]


def process_start(pid: int) -> str | None:
    """When a process started, to tell it from a later one with its pid; None where unknown or exiting."""
    try:
        return start_if_running(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


def process_gone(pid: int, started: str | int | None = None, seen: str = "it was seen") -> str | None:
    """Why process ``pid`` of this host runs no more; None while it runs or where this host cannot tell."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"no process {pid} runs on this host"
    except PermissionError:
        pass
    try:
        now = start_if_running(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None
    if now is None:
        return f"process {pid} has exited"
    if started is not None and now != str(started):
        return f"process {pid} is another program now, started after {seen}"
    return None


def wait_for_exit(processes: list[subprocess.Popen], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` in all for ``processes`` to exit; kill the ones still running then."""
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
