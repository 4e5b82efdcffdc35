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
    exits_on_eof = "import sys; print('up', flush=True); sys.stdin.read(); raise SystemExit(75)"
    quick = subprocess.Popen([sys.executable, "-c", exits_on_eof], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    stuck = python("import time; time.sleep(60)")
    assert quick.stdout.readline() == b"up\n"  # started: all it has left to do by the deadline is exit
    quick.stdin.close()
    start = time.monotonic()
    wait_for_exit([quick, stuck], timeout_s=3.0)
    assert quick.returncode == 75 and stuck.wait(timeout=10) < 0  # killed: a signal's status
    quick.stdout.close()
    assert time.monotonic() - start < 20  # one deadline for all, not one each


def test_no_wait_once_every_process_has_exited():
    done = python("pass")
    done.wait(timeout=30)
    start = time.monotonic()
    wait_for_exit([done], timeout_s=30.0)
    assert time.monotonic() - start < 1 and done.returncode == 0
