"""Where the test suite's CPU goes: per test file, the fresh Python interpreters its tests start, the commands they
fork from the prewarmed server (tests/prewarmed.py), and the CPU-seconds used.

    python scripts/suite_cost.py                           # the README's test command, python -m pytest
    python scripts/suite_cost.py -n 0 tests/workflows      # any arguments of pytest

Runs pytest with this file as a plugin (``-p suite_cost``) and, for the run only, a ``sitecustomize`` on
``PYTHONPATH`` that logs every interpreter that starts under it with the test that started it
(``PYTEST_CURRENT_TEST``, which every process inherits); a command forked from the prewarmed server is no fresh
interpreter and is counted as forked. A test's CPU-seconds are those of its pytest worker and of all the worker's
descendants from the test's setup to its teardown: the worker's own, its reaped children's
(``RUSAGE_CHILDREN``), and those of the children still alive (the prewarmed server, with the commands it forked
and reaped); and those of the interpreters that do not descend from pytest (SLURM's jobs), each logged when it
exits. Not counted: an interpreter that does not descend from pytest and is killed, the programs other than
Python that such an interpreter does not start, and a process that outlives its test (counted where it ends, if
its parent reaps it). An interpreter started with another ``PYTHONPATH`` (the template tests' projects) or with
``-S``/``-I`` is not seen.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

LOG, PYTEST = "SUITE_COST_LOG", "SUITE_COST_PYTEST"
SITECUSTOMIZE = """\
import atexit, os, resource


def log(kind, value):
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    try:
        with open(os.environ["SUITE_COST_LOG"], "a") as file:  # one short write: every line stays whole
            file.write(f"{test}\\t{kind}\\t{value}\\n")
    except OSError:  # a process of another user (a SLURM job's) prints nothing about it
        pass


def beside_pytest():
    \"\"\"At exit: the CPU of an interpreter that pytest's processes do not reap (a SLURM job's).\"\"\"
    pid = os.getpid()
    while pid > 1 and str(pid) != os.environ.get("SUITE_COST_PYTEST"):
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
    if pid <= 1:
        used = resource.getrusage(resource.RUSAGE_SELF)
        log("beside", used.ru_utime + used.ru_stime)


if "SUITE_COST_LOG" in os.environ:
    log("fresh", 1)
    atexit.register(beside_pytest)
"""
TICK = os.sysconf("SC_CLK_TCK")


def _log(test: str, kind: str, value: float = 1) -> None:
    with open(os.environ[LOG], "a") as file:
        file.write(f"{test}\t{kind}\t{value}\n")


def _cpu_seconds() -> float:
    """This process's CPU time, its reaped descendants', and its living children's (with what they reaped)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if fields[1] == me:  # the parent's pid; then utime, stime, cutime, cstime in clock ticks
            seconds += sum(int(ticks) for ticks in fields[11:15]) / TICK
    return seconds


# --- the plugin, in each pytest process ----------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    os.environ[PYTEST] = str(os.getpid())  # what runs below it is counted here; an interpreter elsewhere logs its own


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    _count_forks()
    before = _cpu_seconds()
    try:
        return (yield)
    finally:
        _log(item.nodeid, "cpu", _cpu_seconds() - before)


def _count_forks() -> None:
    prewarmed = sys.modules.get("tests.prewarmed")
    start = getattr(prewarmed, "_Server", None) and prewarmed._Server.start
    if start is None or getattr(start, "counted", False):
        return

    def counted(self: object, *args: object, **kwargs: object) -> object:
        _log(os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0], "forked")
        return start(self, *args, **kwargs)

    counted.counted = True
    prewarmed._Server.start = counted


# --- the command -----------------------------------------------------------------------------------------------


def report(log: Path, pytest_cpu: float) -> None:
    """The table: ``pytest_cpu`` is that of pytest and all it reaped; what no test's CPU holds is outside tests."""
    outside = "(outside tests: pytest and its workers starting, collecting)"
    rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    tests: dict[str, set[str]] = defaultdict(set)
    for line in log.read_text().splitlines() if log.exists() else []:
        test, kind, value = line.split("\t")
        file = test.split("::")[0] or outside
        rows[file][kind] += float(value)
        tests[file].add(test)
    rows[outside]["cpu"] += pytest_cpu - sum(row["cpu"] for row in rows.values())
    tests[outside] = set()
    for row in rows.values():
        row["cpu"] += row["beside"]
    total = {kind: sum(row[kind] for row in rows.values()) for kind in ("fresh", "forked", "cpu")}
    width = max(len(file) for file in rows)
    print(f"\n{'test file':<{width}}  {'tests':>5}  {'fresh':>5}  {'forked':>6}  {'CPU-s':>7}")
    for file, row in [*sorted(rows.items(), key=lambda item: -item[1]["cpu"]), ("total", total)]:
        count = len(tests[file]) if file != "total" else sum(len(names) for names in tests.values())
        print(f"{file:<{width}}  {count:>5}  {row['fresh']:>5.0f}  {row['forked']:>6.0f}  {row['cpu']:>7.1f}")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="suite-cost-") as folder:
        hooks = Path(folder)
        (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
        (hooks / "suite_cost.py").symlink_to(Path(__file__).resolve())
        log = hooks / "log.tsv"
        path = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path, **{LOG: str(log)})
        tests = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cost", *sys.argv[1:]], env=env)
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        report(log, used.ru_utime + used.ru_stime)
    return tests.returncode


if __name__ == "__main__":
    raise SystemExit(main())
