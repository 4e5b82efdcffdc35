"""The processes of a run (multigpu/faults/processes.py): one rule for whether a process runs (no process, a zombie, one
begun to exit, another program given its pid), and the ones a run started waited for within one deadline, the ones
still running then killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from multigpu.faults.processes import PF_EXITING, process_gone, process_start, start_if_running, wait_for_exit


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


def test_a_process_that_exits_or_has_exited_runs_no_more():
    """A rank killed outright closes its connections while it exits, before it is a zombie: the peer that reads the
    closed connection must find it gone, not signal it and wait for a dump that never comes."""
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    head, tail = stat.rsplit(")", 1)
    fields = tail.split()
    assert start_if_running(stat) == process_start(os.getpid()) == fields[19]
    fields[6] = str(int(fields[6]) | PF_EXITING)  # the same process, begun to exit
    assert start_if_running(f"{head}) {' '.join(fields)}") is None
    ended = subprocess.Popen([sys.executable, "-c", ""])
    os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert process_start(ended.pid) is None
    ended.wait()


def test_a_process_is_gone_once_it_has_exited_or_its_pid_names_another_program():
    me = os.getpid()
    assert process_gone(me) is None and process_gone(me, process_start(me)) is None  # runs, as it was seen
    later = process_gone(me, "1", seen="the lock was taken")  # the pid now names a process started later
    assert later == f"process {me} is another program now, started after the lock was taken"
    ended = subprocess.Popen([sys.executable, "-c", ""])
    os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert process_gone(ended.pid) == f"process {ended.pid} has exited"
    ended.wait()
    assert process_gone(ended.pid) == f"no process {ended.pid} runs on this host"
