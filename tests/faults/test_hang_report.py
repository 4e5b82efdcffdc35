"""Stack dumps read and reported: the parsing is tested on real faulthandler output, the user's frame, the
collective and the phase of a stack, and the reports of a collective that failed and of a run's stacks grouped (the
runs that take the dumps are in tests/faults/test_stack_dumps.py)."""

from __future__ import annotations

import faulthandler
import inspect
import threading
from pathlib import Path

import torch
import torch.autograd.graph
import torch.distributed.distributed_c10d

from multigpu.faults.hang_report import (
    MARK,
    Frame,
    RankView,
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
from tests.conftest import REPO

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
        Frame(str(REPO / "myproject" / "models" / "mine.py"), 12, "training_step"),  # the user's project
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
