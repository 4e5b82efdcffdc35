"""How the command line reports an exception (multigpu/errors/reporting.py): one paragraph and the exit status of
its kind;
an error of the code keeps its traceback; rank 0 speaks for the ranks it starts (its desk, in a process of its own
here). The reports of real runs: tests/errors/test_errors.py, tests/faults/test_stack_dumps.py."""

from __future__ import annotations

import errno
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from lightning.fabric.utilities.rank_zero import rank_zero_only

from multigpu.errors import DEBUG_ENV, ConfigurationError, reporting
from multigpu.errors.reporting import COLLECTIVE_FAILURE_EXIT_CODE, REPORT_DESK_ENV, hand_over, report
from tests import prewarmed
from tests.conftest import REPO, cli_env
from tests.errors.test_failures import GLOO_TIMEOUT


def test_a_failed_collective_is_reported_as_one_paragraph_with_exit_status_70(capsys):
    error = RuntimeError(GLOO_TIMEOUT)
    assert report(error) == COLLECTIVE_FAILURE_EXIT_CODE == 70
    printed = capsys.readouterr().err
    assert (
        printed.count("\n") == 1 and "another rank did not arrive in time" in printed and "multigpu.stacks" in printed
    )
    error.collective_report = "rank 1 did not arrive"  # what multigpu/faults/stack_dumps.py attaches
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


# -- rank 0 speaks for the ranks it starts --------------------------------------------------------------------------

#: rank 0 with its desk open, as under ddp from one command: it says the desk's address, then takes its orders on
#: stdin ("speak": it reports a failure of its own, and says so; end of input: the desk closes); at an exit with a
#: rank's status, ``before_exit`` writes the file ``argv[1]``; ``argv[2]``: the platform it runs as
RANK_ZERO = """
import sys
from pathlib import Path
from types import SimpleNamespace
sys.platform = sys.argv[2]
from multigpu.errors.reporting import report_desk, speak_for_the_run
trainer = SimpleNamespace(strategy=SimpleNamespace(launcher=None))
with report_desk(trainer, before_exit=lambda: Path(sys.argv[1]).write_text("let go")) as desk:
    print(desk.address, flush=True)
    for order in sys.stdin:
        speak_for_the_run()
        print("speaking", flush=True)
"""


@pytest.fixture(params=["linux", "darwin"])
def rank_zero(tmp_path, request):
    """Rank 0's process with its desk: on Linux a socket of the abstract namespace, elsewhere a socket file."""
    process = prewarmed.popen(
        [sys.executable, "-c", RANK_ZERO, str(tmp_path / "exited"), request.param],
        cwd=REPO,
        env=cli_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    address = process.stdout.readline().strip()
    abstract = request.param == "linux"
    assert address.startswith("@multigpu-report-" if abstract else "/"), process.communicate()[1]
    assert abstract or Path(address).is_socket()
    yield process, address
    ended_itself = process.poll() is not None
    if not ended_itself:
        process.kill()
    process.wait()
    assert abstract or not ended_itself or not Path(address).parent.exists()  # a desk's folder goes with it
    for pipe in (process.stdin, process.stdout, process.stderr):
        pipe.close()


def ended(process: subprocess.Popen) -> str:
    """What rank 0 printed on stderr, once it has exited."""
    if not process.stdin.closed:
        process.stdin.close()
    stderr = process.stderr.read()  # to its end: the process has exited
    process.wait(timeout=60)
    return stderr


def test_a_rank_whose_failure_comes_first_is_reported_by_rank_0_which_exits_with_its_status(rank_zero, tmp_path):
    process, address = rank_zero
    assert hand_over(address, {"text": "error: (rank 1) --data.x=1 is wrong. Fix: y.", "status": 2}) is True
    stderr = ended(process)
    assert process.returncode == 2 and stderr == "error: (rank 1) --data.x=1 is wrong. Fix: y.\n"
    assert (tmp_path / "exited").read_text() == "let go"  # the run directory's lock, where a run holds one


def test_a_rank_reports_nothing_while_rank_0_reports_its_own_failure(rank_zero):
    process, address = rank_zero
    process.stdin.write("speak\n")
    process.stdin.flush()
    assert process.stdout.readline() == "speaking\n"
    assert hand_over(address, {"text": "error: (rank 1) the same error", "status": 2}) is True  # taken, not printed
    stderr = ended(process)
    assert process.returncode == 0 and stderr == ""


def test_a_report_that_rank_0s_covers_waits_for_it_and_a_rank_whose_rank_0_is_gone_reports_itself(rank_zero):
    process, address = rank_zero
    answered: list[bool] = []
    waiting = threading.Thread(target=lambda: answered.append(hand_over(address, COVERED)))
    waiting.start()
    assert waiting.is_alive()  # no answer: rank 0 fails in its collective too, reports, and stops this rank
    process.stdin.close()  # here the desk closes instead: this rank hears that nobody reports for it
    waiting.join(timeout=60)
    assert answered == [False]
    stderr = ended(process)
    assert process.returncode == 0 and stderr == ""
    assert hand_over(address, {"text": "error: (rank 1) x", "status": 2}) is False  # no desk: rank 0 is gone


COVERED = {"text": "error: (rank 1) a collective failed on rank 1", "status": 70, "rank_zero_reports": True}


def test_an_error_every_rank_meets_is_left_to_rank_0_whichever_rank_fails_first(monkeypatch, capsys):
    """A check of what the ranks share fails on each: the report rank 1 hands over waits for rank 0's (above), so
    the run prints rank 0's, not the one of whichever rank came first; one of this rank alone is printed first."""
    handed: list[dict] = []
    monkeypatch.setattr(reporting, "hand_over", lambda address, message: handed.append(message) or True)
    monkeypatch.setenv(REPORT_DESK_ENV, "@desk")
    monkeypatch.setattr(rank_zero_only, "rank", 1, raising=False)
    assert report(ConfigurationError("--x=1 is wrong on every rank. Fix: y.", every_rank=True)) == 2
    assert report(ConfigurationError("--x=1 is wrong on this rank. Fix: y.")) == 2
    assert [(m["text"], m["rank_zero_reports"]) for m in handed] == [
        ("error: (rank 1) --x=1 is wrong on every rank. Fix: y.", True),
        ("error: (rank 1) --x=1 is wrong on this rank. Fix: y.", False),
    ]
    assert capsys.readouterr().err == ""
