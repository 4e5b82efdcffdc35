"""Every rank's stacks on SIGUSR2, and the report of a collective that failed: the stuck rank, its line, the
collective the others wait in. Two ddp runs on two CPU processes test the whole: one rank stuck in its
``training_step``, and ``python -m multigpu.stacks`` on a live run (the parsing and the reports are tested in
tests/faults/test_hang_report.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from multigpu.checkpoints.files import is_intact
from multigpu.faults.hang_report import latest_main_stack, parse_dumps
from multigpu.faults.stack_dumps import (
    FAILED,
    DumpMark,
    StackDumps,
    dump_marks,
    dump_state,
    read_states,
    wait_for_dumps,
)
from multigpu.stacks import stacks_of
from tests import prewarmed
from tests.conftest import REPO, TINY, cli_env
from tests.zoo import stuck

# one worker runs these one after another: most of each is waiting for a collective timeout, and two such waits at
# once leave a core idle that the other workers' tests would use
pytestmark = pytest.mark.xdist_group("test_stack_dumps")


def test_one_process_registers_nothing(tmp_path):
    callback = StackDumps()
    trainer = SimpleNamespace(world_size=1, default_root_dir=str(tmp_path), checkpoint_callback=None)
    callback.setup(trainer, None, "fit")  # type: ignore[arg-type]
    callback.teardown(trainer, None, "fit")  # type: ignore[arg-type]
    assert callback.folder is None and not (tmp_path / "stacks").exists()


#: a process that dumps its stacks on SIGUSR2 as a rank does, with 90 threads (a dump of many writes; faulthandler
#: names 100 at most), or ignores the signal as a reporting rank does; it says when it is ready, and exits when its
#: input closes
DUMPER = """
import faulthandler, signal, sys, threading
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
else:
    faulthandler.register(signal.SIGUSR2, file=open(sys.argv[1], "a"), all_threads=True, chain=False)
release = threading.Event()
for _ in range(90):
    threading.Thread(target=release.wait, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def dumper(tmp_path):
    """Start ``DUMPER`` (``"dump"`` or ``"ignore"``) on ``tmp_path/rank-0.txt``, which holds an earlier dump; return
    the process, ready, and its mark."""
    processes = []

    def started(answer: str) -> tuple[subprocess.Popen, DumpMark]:
        path = tmp_path / "rank-0.txt"
        path.write_text("# an earlier dump\n")
        command = [sys.executable, "-c", DUMPER, str(path), answer]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        processes.append(process)
        assert process.stdout.readline() == "ready\n"
        return process, DumpMark(process.pid, len("# an earlier dump\n"))

    yield started
    for process in processes:
        process.stdin.close()
        process.wait(timeout=60)
        process.stdout.close()


def test_a_dump_is_read_once_its_writer_is_done(tmp_path, dumper):
    process, mark = dumper("dump")
    os.kill(process.pid, signal.SIGUSR2)
    dumps = wait_for_dumps(tmp_path, {0: mark}, timeout_s=60)
    (threads,) = parse_dumps(dumps[0])  # one dump, whole: every thread of the process
    assert len(threads) == 91 and dump_state(process.pid) == "done"
    assert "# an earlier dump\n" + dumps[0] == (tmp_path / "rank-0.txt").read_text()


def test_a_rank_that_ignores_the_signal_is_waited_for_until_its_state_says_it_reports(tmp_path, dumper):
    process, mark = dumper("ignore")
    os.kill(process.pid, signal.SIGUSR2)
    read: list[dict[int, str]] = []
    waiting = threading.Thread(target=lambda: read.append(wait_for_dumps(tmp_path, {0: mark}, timeout_s=600)))
    waiting.start()
    assert waiting.is_alive() and dump_state(process.pid) == "ignored"  # it dumps nothing; its state says nothing yet
    (tmp_path / "rank-0.json").write_text(json.dumps({"rank": 0, "phase": FAILED}))  # as a reporting rank says
    waiting.join(timeout=60)
    assert read == [{}] and (tmp_path / "rank-0.txt").read_text() == "# an earlier dump\n"


# -- two processes ----------------------------------------------------------------------------------------------

#: the collective timeout of the stuck runs; the ranks' start (rank 1's imports, which ddp begins only once rank 0
#: is set up) is bounded apart, by multigpu/strategies/ddp.py's START_TIMEOUT
TIMEOUT_S = 20
#: how long a run of these may take before it counts as hung (a failure bound: the proofs are in what they print)
HANG_S = 300
DDP_CPU = ["--trainer.accelerator=cpu", "--trainer.strategy=ddp", "--trainer.devices=2", "--progress_bar=none"]
STUCK_LINE = next(i for i, text in enumerate(Path(stuck.__file__).read_text().splitlines(), 1) if "STUCK" in text)
GATHER_LINE = next(i for i, text in enumerate(Path(stuck.__file__).read_text().splitlines(), 1) if "GATHERS" in text)
FAIL_LINE = next(i for i, text in enumerate(Path(stuck.__file__).read_text().splitlines(), 1) if "FAILS HERE" in text)


def start(*args: str) -> subprocess.Popen:
    """The CLI in a session of its own, so that a test can signal (or kill) every rank and none outlives it."""
    return prewarmed.popen(
        [sys.executable, "-m", "tests.cli", "fit", *TINY, *DDP_CPU, *args],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen, timeout: float) -> str:
    try:
        return process.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"hung past {timeout} s:\n{process.communicate()[1][-4000:]}")


def stacks_command(run_dir: Path, *args: str) -> str:
    command = [sys.executable, "-m", "multigpu.stacks", str(run_dir), *args]
    result = prewarmed.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_a_rank_stuck_in_its_training_step_is_named_with_its_line_when_the_others_time_out(tmp_path):
    run_dir = tmp_path / "run"
    process = start(
        "--model=tests.zoo.stuck.SleepyClassifier",
        "--model.init_args.stuck_at_step=3",
        "--trainer.val_check_interval=2",
        "--trainer.check_val_every_n_epoch=null",
        "--trainer.limit_val_batches=1",
        f"--collective_timeout={TIMEOUT_S}",
        f"--trainer.default_root_dir={run_dir}",
    )
    stderr = finish(process, HANG_S)
    assert process.returncode == 70, stderr[-3000:]
    report = stderr.strip().splitlines()[-1]  # the last paragraph, not the survivor's traceback
    assert report.startswith("error: a collective failed on rank 0 (RuntimeError: ") and "Timed out" in report
    assert f"{TIMEOUT_S * 1000}ms" in report  # the collective timeout ended it, whatever the ranks' start took
    assert f"Rank 1 did not arrive: it is at step 3, in training_step, at {stuck.__file__}:{STUCK_LINE}" in report
    assert "Rank 0 waits in DDP's gradient all-reduce in backward at step 3" in report
    assert f"{run_dir / 'stacks'}" in report and "Traceback" not in stderr
    for rank in (0, 1):  # each rank's stacks, the reporting rank's own from its exception
        assert latest_main_stack((run_dir / "stacks" / f"rank-{rank}.txt").read_text())
    assert is_intact(run_dir / "checkpoints" / "last.ckpt")
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
    shown = stacks_command(run_dir, "--no-signal")
    assert "rank 0: step 3; backward; waiting in DDP's gradient all-reduce" in shown
    assert f"rank 1: step 3; training_step; not in a collective\n    {stuck.__file__}:{STUCK_LINE}" in shown


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "waits_in"),
    [
        # Lightning runs no on_exception in a ddp_spawn worker: the launching process reports, once torch has
        # stopped the workers (SIGTERM, then SIGKILL 30 s later), from the dump each left at its SIGTERM
        ("ddp_spawn", "Rank 0 waits in DDP's gradient all-reduce in backward at step 3"),
        ("fsdp2", "Rank 0 waits in torch.distributed.all_gather_single at step 3"),  # FSDP2 gathers in forward
    ],
)
@pytest.mark.extended
def test_a_stuck_rank_is_named_under_other_launchers_and_strategies(strategy, waits_in, tmp_path):
    run_dir = tmp_path / "run"
    process = start(
        "--model=tests.zoo.stuck.SleepyClassifier",
        "--model.init_args.stuck_at_step=3",
        "--trainer.limit_val_batches=0",
        f"--trainer.strategy={strategy}",
        f"--collective_timeout={TIMEOUT_S}",
        f"--trainer.default_root_dir={run_dir}",
    )
    stderr = finish(process, HANG_S)
    assert process.returncode == 70, stderr[-3000:]
    report = stderr.strip().splitlines()[-1]
    assert f"Timed out waiting {TIMEOUT_S * 1000}ms" in report, report  # the collective timeout ended it
    assert f"Rank 1 did not arrive: it is at step 3, in training_step, at {stuck.__file__}:{STUCK_LINE}" in report
    assert waits_in in report and "Traceback" not in stderr, report


@pytest.mark.slow
@pytest.mark.extended
def test_a_desync_names_the_collective_each_rank_called_and_where(tmp_path):
    run_dir = tmp_path / "run"
    process = start(
        "--model=tests.zoo.stuck.DesyncClassifier",  # rank 1 alone gathers, at step 3
        "--trainer.limit_val_batches=0",
        f"--collective_timeout={TIMEOUT_S}",
        f"--trainer.default_root_dir={run_dir}",
    )
    stderr = finish(process, HANG_S)
    assert process.returncode == 70, stderr[-3000:]
    report = stderr.strip().splitlines()[-1]
    assert "Rank 0 waits in DDP's gradient all-reduce in backward at step 3." in report, report
    gathers = f"Rank 1 waits in torch.distributed.all_gather at step 3, called from {stuck.__file__}:{GATHER_LINE}"
    assert gathers in report, report
    assert "not the same one" in report and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in report and "Traceback" not in stderr


@pytest.mark.slow
def test_the_rank_that_raised_first_is_the_error_read_last(tmp_path):
    """Rank 1 raises in its training step: every process stops promptly (rank 0 in the all-reduce it waited in,
    without waiting out the collective timeout, 900 s by default), with one traceback and the first failure read
    last."""
    run_dir = tmp_path / "run"
    process = start(
        "--model=tests.zoo.stuck.FailingClassifier",
        "--trainer.limit_val_batches=0",
        f"--trainer.default_root_dir={run_dir}",
    )
    stderr = finish(process, HANG_S)
    assert process.returncode == 70, stderr[-3000:]
    assert stderr.count("Traceback") == 1, stderr[-3000:]  # rank 1's own; rank 0's lost connection is one line
    last = stderr.strip().splitlines()[-1]
    # rank 0 stopped as its all-reduce lost rank 1, not at the collective timeout (900 s by default)
    assert last.startswith("error: rank 0 lost the other ranks in DDP's gradient all-reduce"), last
    assert "Timed out" not in last, last
    first = f"The first failure: rank 1: ValueError: a sample of rank 1 has no label at {stuck.__file__}:{FAIL_LINE}"
    assert first in last, last


@pytest.mark.slow
@pytest.mark.extended
def test_sigusr2_to_a_live_run_dumps_every_rank_and_training_goes_on(tmp_path):
    run_dir, progress = tmp_path / "run", tmp_path / "progress"
    process = start(
        "--trainer.max_steps=8",  # 8 s: time to read the stacks and signal the ranks while they train
        "--trainer.limit_val_batches=0",
        "--trainer.callbacks+=tests.helpers.Pace",
        "--trainer.callbacks.seconds=1",
        f"--trainer.callbacks.progress_file={progress}",
        f"--trainer.default_root_dir={run_dir}",
    )
    deadline = time.monotonic() + HANG_S
    while not (progress.is_file() and progress.read_text().strip()):  # every rank set up: past the first step
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.05)
    marks = dump_marks(run_dir / "stacks", read_states(run_dir / "stacks"))
    assert sorted(marks) == [0, 1], marks
    os.killpg(process.pid, signal.SIGUSR2)  # every rank, as `scancel --signal=USR2` or `pkill -USR2 -f tests.cli`
    assert sorted(wait_for_dumps(run_dir / "stacks", marks, timeout_s=60)) == [0, 1]  # each rank's dump, whole
    # what `python -m multigpu.stacks RUN_DIR [--no-signal]` prints (the command itself: the stuck test above), called
    # here so that the run is still training when it signals (a command's start-up on a loaded machine takes
    # seconds)
    read = stacks_of(run_dir / "stacks", send=False)
    assert process.poll() is None, "the run ended before it could be signalled"
    fresh = stacks_of(run_dir / "stacks", send=True)  # signals the live ranks itself
    for shown in (read, fresh):
        assert ("ranks 0-1: " in shown or ("rank 0: " in shown and "rank 1: " in shown)) and "no stack" not in shown
    assert "tests/helpers.py" in fresh or "tests/helpers.py" in read  # Pace's sleep, where a rank spends its step
    stderr = finish(process, HANG_S)
    assert process.returncode == 0, stderr[-3000:]
    assert "straggler: " not in stderr  # ranks paced alike: none is named (tests/observe/test_straggler.py)
    for rank in (0, 1):
        assert len(parse_dumps((run_dir / "stacks" / f"rank-{rank}.txt").read_text())) == 2
