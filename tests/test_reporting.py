"""How the command line reports an exception (multigpu/reporting.py): one paragraph and the exit status of its kind;
an error of the code keeps its traceback. The reports of real runs: tests/test_errors.py."""

from __future__ import annotations

import errno

import pytest

from multigpu.errors import DEBUG_ENV, ConfigurationError
from multigpu.reporting import COLLECTIVE_FAILURE_EXIT_CODE, report
from tests.test_failures import GLOO_TIMEOUT


def test_a_failed_collective_is_reported_as_one_paragraph_with_exit_status_70(capsys):
    error = RuntimeError(GLOO_TIMEOUT)
    assert report(error) == COLLECTIVE_FAILURE_EXIT_CODE == 70
    printed = capsys.readouterr().err
    assert (
        printed.count("\n") == 1 and "another rank did not arrive in time" in printed and "multigpu.stacks" in printed
    )
    error.collective_report = "rank 1 did not arrive"  # what multigpu/callbacks/stack_dumps.py attaches
    report(error)
    assert capsys.readouterr().err == "error: rank 1 did not arrive\n"


def test_user_errors_are_one_paragraph_with_their_exit_status_and_others_keep_their_traceback(capsys, monkeypatch):
    wrapped = ValueError("as jsonargparse wraps a constructor's error")
    wrapped.__cause__ = ConfigurationError("--data.x=1 is wrong. Fix: y.")
    assert report(wrapped) == 2 and capsys.readouterr().err == "error: --data.x=1 is wrong. Fix: y.\n"
    assert report(OSError(errno.ENOSPC, "No space left on device", "/runs/a/last.ckpt")) == 1
    assert capsys.readouterr().err.startswith("error: disk full: writing /runs/a/last.ckpt")
    own = KeyError("batch")
    with pytest.raises(KeyError) as raised:
        report(own)
    assert raised.value is own and capsys.readouterr().err == ""
    monkeypatch.setenv(DEBUG_ENV, "true")  # every error as a traceback
    with pytest.raises(ValueError):
        report(wrapped)
