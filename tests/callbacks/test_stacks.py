"""Every rank's stacks on SIGUSR2, and the report of a collective that failed: the stuck rank, its line, the
collective the others wait in. The parsing is tested on real faulthandler output; two ddp runs on two CPU
processes test the whole: one rank stuck in its ``training_step``, and ``python -m multigpu.stacks`` on a live run."""

from __future__ import annotations

import faulthandler
import inspect
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
import torch.autograd.graph
import torch.distributed.distributed_c10d

from multigpu.callbacks.stacks import (
    MARK,
    Frame,
    RankView,
    StackDumps,
    collective_of,
    format_groups,
    format_stack,
    frames_of_traceback,
    group_stacks,
    hang_report,
    latest_main_stack,
    main_thread,
    parse_dumps,
    phase_of,
    rank_list,
    user_frame,
)
from multigpu.checkpoints.files import is_intact
from multigpu.stacks import stacks_of
from tests import prewarmed
from tests.conftest import REPO, TINY, cli_env
from tests.zoo import stuck

HERE = str(Path(__file__).resolve())
SITE = str(Path(torch.__file__).parents[1])  # site-packages
C10D = torch.distributed.distributed_c10d.__file__
AUTOGRAD = torch.autograd.graph.__file__


def training_step(path: Path) -> int:
    """A user's step that dumps every thread's stacks twice, as two SIGUSR2 would; returns the first dump's line."""
    with open(path, "a") as file:
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        faulthandler.dump_traceback(file, all_threads=True)
        faulthandler.dump_traceback(file, all_threads=True)
    return line


def test_dumps_are_split_per_signal_and_the_main_thread_found_whichever_thread_dumped(tmp_path):
    path = tmp_path / "rank-0.txt"
    release = threading.Event()
    helper = threading.Thread(target=release.wait, daemon=True)
    helper.start()
    line = training_step(path)
    release.set()
    dumps = parse_dumps(path.read_text())
    assert len(dumps) == 2 and all(len(threads) >= 2 for threads in dumps)
    assert main_thread(dumps[0]).frames[0] == Frame(HERE, line, "training_step")  # type: ignore[union-attr]
    main = main_thread(dumps[-1])
    assert main is not None and main.frames[0] == Frame(HERE, line + 1, "training_step")
    assert main.frames[1].function == inspect.currentframe().f_code.co_name  # type: ignore[union-attr]
    assert latest_main_stack(path.read_text()) == main.frames
    # a helper thread's stack is never taken for the main thread's, even when it is the one marked current
    other = next(t for t in dumps[-1] if t is not main)
    assert other.frames[-1].function == "_bootstrap"
    main.current, other.current = False, True
    assert main_thread(dumps[-1]) is main
    assert parse_dumps("") == [] and latest_main_stack("") is None
    # a resumed run's process appends to the same file after its mark: its dump is not merged with the last one's
    # (its threads are others, with other ids); nor is a reporting rank's own stack
    resumed = f"{MARK}rank 0, pid 2, from now\n" + format_stack([Frame("/me/train.py", 7, "fit")])
    assert [len(dump) for dump in parse_dumps(path.read_text() + resumed)] == [len(dumps[0]), len(dumps[1]), 1]
    assert latest_main_stack(path.read_text() + resumed) == [Frame("/me/train.py", 7, "fit")]


def test_the_users_frame_is_the_innermost_outside_the_libraries_and_the_templates_machinery():
    frames = [
        Frame(C10D, 2800, "all_reduce"),
        Frame(f"{SITE}/lightning/pytorch/strategies/ddp.py", 300, "reduce"),
        Frame(str(REPO / "multigpu" / "callbacks" / "nan_guard.py"), 50, "on_train_batch_end"),
        Frame(str(REPO / "src" / "models" / "mine.py"), 12, "training_step"),  # the user's project
        Frame(threading.__file__, 300, "wait"),
    ]
    assert user_frame(frames) == frames[3]
    assert user_frame(frames[:3]) is None
    assert collective_of(frames) == "torch.distributed.all_reduce"
    assert collective_of(frames[1:]) == "Lightning's strategy.reduce"
    assert collective_of([Frame(AUTOGRAD, 900, "_engine_run_backward")]) == "DDP's gradient all-reduce in backward"
    assert collective_of(frames[2:]) is None
    assert phase_of(frames) == "training_step"
    assert phase_of([Frame(f"{SITE}/torch/utils/data/dataloader.py", 700, "__next__"), *frames]).startswith("loading")


def test_the_reporting_ranks_own_stack_comes_from_its_exception():
    def wait_in_collective() -> None:
        raise RuntimeError("Timed out")

    try:
        wait_in_collective()
    except RuntimeError as error:
        frames = frames_of_traceback(error.__traceback__)
    assert frames[0].function == "wait_in_collective" and frames[-1].file == HERE


def test_rank_lists_are_ranges():
    assert rank_list([1]) == "rank 1"
    assert rank_list([5, 0, 2, 3, 4, 7]) == "ranks 0, 2-5, 7"


def test_the_report_names_the_rank_that_did_not_arrive_its_line_and_the_collective_the_others_wait_in():
    user = Frame("/home/me/project/model.py", 41, "training_step")
    waiting = [Frame(AUTOGRAD, 979, "_engine_run_backward"), Frame(f"{SITE}/lightning/x.py", 1, "backward")]
    views = [
        RankView(0, {"step": 3}, waiting),
        RankView(1, {"step": 3}, [Frame(f"{SITE}/torch/serialization.py", 9, "load"), user]),
        RankView(2, {"step": 3}, waiting),
        RankView(3, {"step": 2}, None, "its process is gone: it crashed or was killed"),
    ]
    text = hang_report(0, "RuntimeError: Timed out waiting 10000ms", views, "/runs/a/stacks")
    assert "\n" not in text
    assert "Rank 1 did not arrive: it is at step 3, in training_step, at /home/me/project/model.py:41" in text
    assert "Ranks 0, 2 wait in DDP's gradient all-reduce in backward at step 3" in text
    assert "Rank 3 sent no stack (its process is gone" in text
    assert text.endswith("(`python -m multigpu.stacks /runs/a`).")
    # every rank in a collective, different ones: a desync, and the switch that pins it down
    mismatched = [RankView(0, {}, [Frame(C10D, 1, "barrier")]), RankView(1, {}, [Frame(C10D, 2, "all_reduce")])]
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in hang_report(1, "x", mismatched, "/s")


def test_ranks_with_the_same_stack_are_shown_together():
    waiting = [Frame(C10D, 1, "barrier"), Frame("/me/train.py", 9, "on_train_epoch_end")]
    stuck_at = [Frame(f"{SITE}/torch/x.py", 5, "load"), Frame("/me/train.py", 20, "training_step")]
    stacks = {0: waiting, 1: stuck_at, 2: list(waiting), 3: waiting}
    groups = group_stacks(stacks)
    assert [ranks for ranks, _ in groups] == [[0, 2, 3], [1]]
    text = format_groups(stacks, {1: {"step": 7}}, {4: "no dump yet"})
    assert text.startswith("ranks 0, 2-3: on_train_epoch_end; waiting in torch.distributed.barrier")
    assert "rank 1: step 7; training_step; not in a collective\n    " in text and "/me/train.py:20" in text
    assert text.endswith("rank 4: no stack (no dump yet)")


def test_one_process_registers_nothing(tmp_path):
    callback = StackDumps()
    trainer = SimpleNamespace(world_size=1, default_root_dir=str(tmp_path), checkpoint_callback=None)
    callback.setup(trainer, None, "fit")  # type: ignore[arg-type]
    callback.teardown(trainer, None, "fit")  # type: ignore[arg-type]
    assert callback.folder is None and not (tmp_path / "stacks").exists()


# -- two processes ----------------------------------------------------------------------------------------------

#: the collective timeout of the stuck runs; torch's rendezvous waits as long for rank 1, which ddp starts only
#: once rank 0 is set up: its start-up (imports) on a loaded 2-core machine must fit in it
TIMEOUT_S = 20
DDP_CPU = ["--trainer.accelerator=cpu", "--trainer.strategy=ddp", "--trainer.devices=2", "--progress_bar=none"]
STUCK_LINE = next(i for i, text in enumerate(Path(stuck.__file__).read_text().splitlines(), 1) if "STUCK" in text)
GATHER_LINE = next(i for i, text in enumerate(Path(stuck.__file__).read_text().splitlines(), 1) if "GATHERS" in text)
FAIL_LINE = next(i for i, text in enumerate(Path(stuck.__file__).read_text().splitlines(), 1) if "FAILS HERE" in text)


def start(*args: str) -> subprocess.Popen:
    """The CLI in a session of its own, so that a test can signal (or kill) every rank and none outlives it."""
    return prewarmed.popen(
        [sys.executable, "-m", "src.cli", "fit", *TINY, *DDP_CPU, *args],
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
    started = time.monotonic()
    process = start(
        "--model=tests.zoo.stuck.SleepyClassifier",
        "--model.init_args.stuck_at_step=3",
        "--trainer.val_check_interval=2",
        "--trainer.check_val_every_n_epoch=null",
        "--trainer.limit_val_batches=1",
        f"--collective_timeout={TIMEOUT_S}",
        f"--trainer.default_root_dir={run_dir}",
    )
    stderr = finish(process, TIMEOUT_S + 60)
    assert time.monotonic() - started < TIMEOUT_S + 30, stderr[-3000:]
    assert process.returncode == 70, stderr[-3000:]
    report = stderr.strip().splitlines()[-1]  # the last paragraph, not the survivor's traceback
    assert report.startswith("error: a collective failed on rank 0 (RuntimeError: ") and "Timed out" in report
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
def test_a_stuck_rank_is_named_under_other_launchers_and_strategies(strategy, waits_in, tmp_path):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    process = start(
        "--model=tests.zoo.stuck.SleepyClassifier",
        "--model.init_args.stuck_at_step=3",
        "--trainer.limit_val_batches=0",
        f"--trainer.strategy={strategy}",
        f"--collective_timeout={TIMEOUT_S}",
        f"--trainer.default_root_dir={run_dir}",
    )
    stderr = finish(process, TIMEOUT_S + 90)
    grace = 30 if strategy == "ddp_spawn" else 0  # torch.multiprocessing's wait before it SIGKILLs a worker
    assert time.monotonic() - started < TIMEOUT_S + 30 + grace, stderr[-3000:]
    assert process.returncode == 70, stderr[-3000:]
    report = stderr.strip().splitlines()[-1]
    assert f"Rank 1 did not arrive: it is at step 3, in training_step, at {stuck.__file__}:{STUCK_LINE}" in report
    assert waits_in in report and "Traceback" not in stderr, report


@pytest.mark.slow
def test_a_desync_names_the_collective_each_rank_called_and_where(tmp_path):
    run_dir = tmp_path / "run"
    process = start(
        "--model=tests.zoo.stuck.DesyncClassifier",  # rank 1 alone gathers, at step 3
        "--trainer.limit_val_batches=0",
        f"--collective_timeout={TIMEOUT_S}",
        f"--trainer.default_root_dir={run_dir}",
    )
    stderr = finish(process, TIMEOUT_S + 60)
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
    started = time.monotonic()
    process = start(
        "--model=tests.zoo.stuck.FailingClassifier",
        "--trainer.limit_val_batches=0",
        f"--trainer.default_root_dir={run_dir}",
    )
    stderr = finish(process, TIMEOUT_S + 60)
    assert process.returncode == 70, stderr[-3000:]
    assert time.monotonic() - started < 60, stderr[-3000:]
    assert stderr.count("Traceback") == 1, stderr[-3000:]  # rank 1's own; rank 0's lost connection is one line
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: rank 0 lost the other ranks in DDP's gradient all-reduce"), last
    first = f"The first failure: rank 1: ValueError: a sample of rank 1 has no label at {stuck.__file__}:{FAIL_LINE}"
    assert first in last, last


@pytest.mark.slow
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
    deadline = time.monotonic() + 60
    while not (progress.is_file() and progress.read_text().strip()):  # every rank set up: past the first step
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGUSR2)  # every rank, as `scancel --signal=USR2` or `pkill -USR2 -f src.cli`
    time.sleep(0.5)
    # what `python -m multigpu.stacks RUN_DIR [--no-signal]` prints (the command itself: the stuck test above), called
    # here so that the run is still training when it signals (a command's start-up on a loaded machine takes
    # seconds)
    read = stacks_of(run_dir / "stacks", send=False)
    assert process.poll() is None, "the run ended before it could be signalled"
    fresh = stacks_of(run_dir / "stacks", send=True)  # signals the live ranks itself
    for shown in (read, fresh):
        assert ("ranks 0-1: " in shown or ("rank 0: " in shown and "rank 1: " in shown)) and "no stack" not in shown
    assert "tests/helpers.py" in fresh or "tests/helpers.py" in read  # Pace's sleep, where a rank spends its step
    stderr = finish(process, 120)
    assert process.returncode == 0, stderr[-3000:]
    assert "straggler: " not in stderr  # ranks paced alike: none is named (tests/callbacks/test_straggler.py)
    for rank in (0, 1):
        assert len(parse_dumps((run_dir / "stacks" / f"rank-{rank}.txt").read_text())) == 2
