"""The suite's own machinery: pytest-xdist runs the tests of one ``xdist_group`` in one worker, one after another
(the SLURM tests share one small cluster; the tests that read a shared finished run train it once), and a command
forked from the prewarmed server (tests/prewarmed.py) runs as a fresh interpreter runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import prewarmed
from tests.conftest import cli_env

pytestmark = pytest.mark.xdist_group("suite_probe")


def _probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the parent of a worker's temporary folder is the one folder all workers of this run share
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    folder = tmp_path_factory.getbasetemp().parent if run else tmp_path_factory.getbasetemp()
    return folder / f"group-probe-{run or 'serial'}"


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def test_the_first_test_of_a_group_names_its_worker(tmp_path_factory):
    _probe(tmp_path_factory).write_text(_worker())


def test_the_next_test_of_the_group_runs_after_it_in_the_same_worker(tmp_path_factory):
    probe = _probe(tmp_path_factory)
    assert probe.is_file(), "the group's first test has not run before this one: the group was split"
    assert probe.read_text() == _worker(), (
        f"the group ran on workers {probe.read_text()} and {_worker()}: pytest-xdist's --dist loadgroup is not"
        f" honoured by pytest {pytest.__version__} (pyproject.toml caps pytest below 9.2)"
    )


PROBE = """
import json, os, random, sys
import __main__
spec = getattr(__main__, "__spec__", None)
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
    "spec": spec.name if spec else None, "file": getattr(__main__, "__file__", None),
    "env": os.environ.get("PROBE_VALUE"), "own_session": os.getsid(0) == os.getpid(),
    "template_loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("src", "tests", "probe")),
    "random": random.random(),
}))
print("to stderr", file=sys.stderr)
raise SystemExit(int(sys.argv[-1]))
"""


def _probe_runs(tmp_path: Path, *, fresh: bool, new_session: bool = False) -> list[dict]:
    (tmp_path / "probe.py").write_text(PROBE)
    env = cli_env(PROBE_VALUE="42")
    outputs = []
    for words in (["-m", "probe", "a", "3"], [str(tmp_path / "probe.py"), "b", "0"], ["-c", PROBE, "c", "5"]):
        done = prewarmed.run(
            [sys.executable, *words], fresh=fresh, cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=60, start_new_session=new_session,
        )  # fmt: skip
        assert done.stderr.endswith("to stderr\n"), done.stderr
        outputs.append({**json.loads(done.stdout), "code": done.returncode})
    return outputs


NEEDS_THE_SERVER = pytest.mark.skipif(
    os.environ.get("TEMPLATE_TESTS_FRESH") == "1", reason="TEMPLATE_TESTS_FRESH=1: every command starts fresh"
)


@NEEDS_THE_SERVER
def test_a_command_forked_from_the_prewarmed_server_sees_what_a_fresh_interpreter_sees(tmp_path):
    """tests/prewarmed.py: arguments, directory, environment, ``__main__``, session, exit status and output of
    ``python -m MODULE``, ``python SCRIPT`` and ``python -c CODE`` are those of a fresh interpreter."""
    fresh = _probe_runs(tmp_path, fresh=True, new_session=True)
    forked = _probe_runs(tmp_path, fresh=False, new_session=True)
    again = _probe_runs(tmp_path, fresh=False)
    assert [{k: v for k, v in run.items() if k != "random"} for run in forked] == [
        {k: v for k, v in run.items() if k != "random"} for run in fresh
    ]
    assert [run["code"] for run in forked] == [3, 0, 5] and forked[0]["spec"] == "probe"
    assert forked[0]["template_loaded"] == []  # the server imported nothing of the project
    assert all(run["own_session"] for run in forked) and not any(run["own_session"] for run in again)
    assert len({run["random"] for run in forked + again}) == 6  # each child seeds itself, as a fresh one does


@NEEDS_THE_SERVER
def test_the_prewarmed_server_reports_signals_timeouts_and_falls_back_to_a_fresh_interpreter(tmp_path):
    sleeper = [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(60)"]
    process = prewarmed.popen(sleeper, env=cli_env(), stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert isinstance(process, prewarmed.Prewarmed) and process.stdout.readline() == "up\n"
    assert process.poll() is None
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=10) == -signal.SIGTERM
    with pytest.raises(subprocess.TimeoutExpired):
        prewarmed.run(sleeper, env=cli_env(), timeout=1, stdout=subprocess.DEVNULL)
    crashed = prewarmed.run([sys.executable, "-c", "raise ValueError('boom')"], env=cli_env(), capture_output=True)
    assert crashed.returncode == 1 and b"ValueError: boom" in crashed.stderr
    # variables read while torch and Lightning are imported (rank_zero_only takes LOCAL_RANK then): the server's
    # imports would not have seen them
    for variable in ({"TORCH_LOGS": "graph_breaks"}, {"LOCAL_RANK": "1"}):
        started = prewarmed.popen([sys.executable, "-c", "pass"], env=cli_env(**variable))
        assert not isinstance(started, prewarmed.Prewarmed) and started.wait(timeout=60) == 0, variable
