"""``python -m multigpu.stacks RUN_DIR`` (multigpu/stacks.py): every rank's latest stack, ranks with the same stack
together,
and why a rank has none. On real faulthandler dumps; the command on a live two-process run (signalling the ranks)
is in tests/faults/test_stack_dumps.py, whose run also proves the dumps."""

from __future__ import annotations

import faulthandler
import inspect
import json
import os
import socket
from pathlib import Path

from multigpu.faults.processes import process_start
from multigpu.stacks import main, stacks_of

HERE = str(Path(__file__).resolve())


def training_step(path: Path) -> int:
    """A rank's step as its dump shows it; returns the dump's line."""
    with open(path, "a") as file:
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        faulthandler.dump_traceback(file, all_threads=False)
    return line


def write_state(folder: Path, rank: int, hostname: str = socket.gethostname()) -> None:
    """``rank-<N>.json`` of a rank running as this process (on ``hostname``) at step 5."""
    pid = os.getpid()
    state = {"rank": rank, "pid": pid, "hostname": hostname, "started": process_start(pid), "step": 5}
    (folder / f"rank-{rank}.json").write_text(json.dumps(state))


def test_the_ranks_latest_stacks_are_grouped_and_a_rank_without_one_says_why(tmp_path, capsys):
    folder = tmp_path / "run" / "stacks"
    folder.mkdir(parents=True)
    for rank in range(4):
        write_state(folder, rank, hostname="elsewhere" if rank == 2 else socket.gethostname())
    (line,) = {training_step(folder / f"rank-{rank}.txt") for rank in (0, 1)}  # from one line: the same stack
    shown = stacks_of(folder, send=False)
    assert shown.startswith(
        f"ranks 0-1: step 5; training_step; not in a collective\n    {HERE}:{line} in training_step"
    )
    assert shown.endswith(
        "rank 2: no stack (no dump, and no live process of it on this host)\n\nrank 3: no stack (no dump yet)"
    )
    for given in (tmp_path / "run", folder):  # the run directory or its stacks/
        assert main([str(given), "--no-signal"]) == 0
        assert capsys.readouterr().out == f"stacks of the ranks in {folder} (full dumps: rank-N.txt there)\n\n{shown}\n"


def test_a_folder_without_ranks_is_refused_in_one_paragraph(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {tmp_path / 'stacks'} holds no rank's state. Fix: ") and error.count("\n") == 1
