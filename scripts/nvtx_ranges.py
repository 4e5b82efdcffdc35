"""The Nsight preset's NVTX ranges in a real ``python -m src.cli fit --config configs/debug/nsight.yaml`` run, counted
where ``nsys`` is not installed (scripts/gpu_check.sh, part ``nvtx``; under ``nsys``: ``nsys stats --report
nvtx_sum``).

    python scripts/nvtx_ranges.py --out nvtx/ranges.txt -- --trainer.accelerator=gpu --trainer.limit_train_batches=10

Each ``torch.cuda.nvtx.range_start`` / ``range_end`` the run makes also opens and closes a ``torch.profiler`` user
annotation of the same name; the profiler's events give each range name's count and total milliseconds, written to
``--out`` as a table. ``--stand-in`` (a CPU, for testing this script only) lets the preset's callback believe it
trains on CUDA and makes no NVTX call. Exits 1 if no step was marked or a range stayed open.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import Counter, defaultdict
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

PRESET = ["--config", "configs/debug/nsight.yaml", "--progress_bar=none"]


class Annotated:
    """torch.cuda.nvtx's range calls, each mirrored by a profiler annotation; which ranges are open."""

    def __init__(self, nvtx_calls: bool) -> None:
        self.nvtx_calls = nvtx_calls
        self.real = (torch.cuda.nvtx.range_start, torch.cuda.nvtx.range_end)
        self.open: dict[int, tuple[str, object]] = {}
        self.ids = itertools.count(1)

    def range_start(self, name: str) -> int:
        ident = self.real[0](name) if self.nvtx_calls else next(self.ids)
        self.open[ident] = (name, torch.ops.profiler._record_function_enter_new(name, None))
        return ident

    def range_end(self, ident: int) -> None:
        _, handle = self.open.pop(ident)
        torch.ops.profiler._record_function_exit._RecordFunction(handle)
        if self.nvtx_calls:
            self.real[1](ident)


def ranges(events: list, names: set[str]) -> tuple[Counter, dict[str, float]]:
    """Each range name's count and total milliseconds among the profiler's events."""
    counts, totals = Counter(), defaultdict(float)
    for event in events:
        if event.name in names:
            counts[event.name] += 1
            totals[event.name] += event.cpu_time_total / 1000
    return counts, totals


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cli", default="src.cli", help="the project's command-line module")
    parser.add_argument("--stand-in", action="store_true", help="a CPU: the device check stands in, no NVTX call")
    args, fit_args = parser.parse_known_args(argv)
    fit_args = [arg for arg in fit_args if arg != "--"]
    cli = __import__(args.cli, fromlist=["main"])
    annotated = Annotated(nvtx_calls=not args.stand_in)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda.nvtx, "range_start", annotated.range_start))
        stack.enter_context(mock.patch.object(torch.cuda.nvtx, "range_end", annotated.range_end))
        if args.stand_in:
            stack.enter_context(mock.patch("multigpu.observe.nvtx.on_cuda", lambda trainer: True))
        profiler = stack.enter_context(profile(activities=activities))
        cli.main(["fit", *PRESET, *fit_args])
    names = {event.name for event in profiler.events() if event.name.startswith("step ")}
    names |= {"data wait", "forward", "backward", "optimizer", "checkpoint copy"}
    counts, totals = ranges(profiler.events(), names)
    steps = sum(count for name, count in counts.items() if name.startswith("step "))
    rows = [f"{'range':24s} {'count':>6s} {'total ms':>10s}"]
    rows += [f"{name:24s} {counts[name]:6d} {totals[name]:10.1f}" for name in sorted(counts) if name[:5] != "step "]
    rows.append(f"{'step N (all)':24s} {steps:6d} {sum(t for n, t in totals.items() if n[:5] == 'step '):10.1f}")
    rows.append(f"ranges left open: {len(annotated.open)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0 if steps and not annotated.open else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
