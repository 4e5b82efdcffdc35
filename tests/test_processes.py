"""The processes a run started (multigpu/processes.py): waited for within one deadline, the ones still running then
killed."""

from __future__ import annotations

import subprocess
import sys
import time

from multigpu.processes import wait_for_exit


def python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_processes_that_exit_in_time_keep_their_status_and_one_still_running_at_the_deadline_is_killed():
    quick, stuck = python("raise SystemExit(75)"), python("import time; time.sleep(60)")
    start = time.monotonic()
    wait_for_exit([quick, stuck], timeout_s=3.0)
    assert quick.returncode == 75 and stuck.wait(timeout=10) < 0  # killed: a signal's status
    assert time.monotonic() - start < 20  # one deadline for all, not one each


def test_no_wait_once_every_process_has_exited():
    done = python("pass")
    done.wait(timeout=30)
    start = time.monotonic()
    wait_for_exit([done], timeout_s=30.0)
    assert time.monotonic() - start < 1 and done.returncode == 0
