"""The suite's own machinery: pytest-xdist runs the tests of one ``xdist_group`` in one worker, one after another
(the SLURM tests share one small cluster; the tests that read a shared finished run train it once)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
