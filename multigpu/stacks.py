"""Where every rank of a running (or hung) job is: ``python -m multigpu.stacks RUN_DIR``.

Signals every live rank of the run on this host to dump its stacks, then prints each rank's latest dump, ranks with
the same stack together: the rank that is not where the others are is the one to look at. ``--no-signal`` only
reads the latest dumps, e.g. after ``scancel --signal=USR2 JOB`` signalled the ranks on every node.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from multigpu.faults.hang_report import format_groups, latest_main_stack
from multigpu.faults.stack_dumps import (
    DUMP_SIGNAL,
    STACKS_DIR,
    alive_here,
    read_states,
    signal_ranks,
    wait_for_dumps,
)

WAIT_S = 3.0


def stacks_of(folder: Path, send: bool, wait_s: float = WAIT_S) -> str:
    states = read_states(folder)
    fresh = wait_for_dumps(folder, signal_ranks(folder, states), wait_s) if send else {}
    stacks, missing = {}, {}
    for rank in sorted(states):
        path = folder / f"rank-{rank}.txt"
        text = fresh.get(rank) or (path.read_text(errors="replace") if path.is_file() else "")
        frames = latest_main_stack(text)
        if frames:
            stacks[rank] = frames
        elif send and alive_here(states[rank]):
            missing[rank] = f"it did not answer {DUMP_SIGNAL.name} within {wait_s:g} s"
        else:
            gone = "no dump, and no live process of it on this host"
            missing[rank] = "no dump yet" if alive_here(states[rank]) else gone
    return format_groups(stacks, states, missing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multigpu.stacks", description=__doc__.split("\n\n")[1])
    parser.add_argument("run_dir", type=Path, help="the run directory (--trainer.default_root_dir), or its stacks/")
    parser.add_argument("--no-signal", action="store_true", help="only read the latest dumps; signal no rank")
    parser.add_argument("--wait", type=float, default=WAIT_S, help="seconds to wait for the ranks' dumps")
    args = parser.parse_args(argv)
    folder = args.run_dir if args.run_dir.name == STACKS_DIR else args.run_dir / STACKS_DIR
    if not any(folder.glob("rank-*.json")):
        print(
            f"error: {folder} holds no rank's state. Fix: give the run directory of a run of several processes"
            " (--trainer.default_root_dir); its ranks write there once training is set up.",
            file=sys.stderr,
        )
        return 2
    print(f"stacks of the ranks in {folder} (full dumps: rank-N.txt there)\n")
    print(stacks_of(folder, send=not args.no_signal, wait_s=args.wait))
    return 0


if __name__ == "__main__":
    sys.exit(main())
