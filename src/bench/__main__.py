"""``python -m src.bench``: the template's strategies against bare Lightning and plain PyTorch, in one command.

Examples::

    python -m src.bench --quick                      # about two minutes on a 2-core CPU
    python -m src.bench                              # both workloads, every strategy, 1..N devices, 3 repeats
    python -m src.bench --workload image --strategies ddp,plain-ddp --devices 1,2 --batch-sizes 16,64,256

Rows: ``single`` (one device), ``dp``, ``ddp``, ``ddp_spawn`` (the template through ``python -m src.cli fit``),
``bare-lightning``, ``bare-lightning-ddp`` (a minimal LightningModule and a plain ``L.Trainer``) and
``plain-loop``, ``plain-ddp`` (hand-written PyTorch). On a CPU, devices are processes with a fixed number of
threads each, DDP uses gloo, and ``dp`` is a pass-through (one process). Results go to ``--out``:
``results.json``, ``results.csv``, ``results.md`` and two PNG plots.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from src.bench.environment import load_average, machine_info
from src.bench.report import build_table, write_all
from src.bench.runner import (
    MULTIPROCESS,
    MULTIPROCESS_BASELINES,
    ONE_DEVICE_ROWS,
    STRATEGY_LABELS,
    Row,
    Settings,
    run_all,
    run_env,
)
from src.bench.startup import measure_startup
from src.bench.workloads import WORKLOADS, build_cli, flops_per_sample, global_batch_size, tokens_per_sample
from src.callbacks.throughput import compute_kind, dense_peak_flops

PRECISION_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m src.bench",
        description="Training throughput of the template's strategies against bare Lightning and plain PyTorch.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--quick", action="store_true", help="small models, few steps, one repeat: about two minutes")
    parser.add_argument(
        "--workload", type=_names, help=f"comma-separated: {', '.join(WORKLOADS)} (default: all; quick: image)"
    )
    parser.add_argument(
        "--strategies",
        type=_names,
        help=f"comma-separated from {', '.join(STRATEGY_LABELS)} (default: all); the 1-device rows"
        f" ({', '.join(ONE_DEVICE_ROWS)}) are always added, and with any multi-process row"
        f" {' and '.join(MULTIPROCESS_BASELINES)}",
    )
    parser.add_argument(
        "--devices", type=_ints, help="device counts, e.g. 1,2 (default: 1, 2, 4, ... up to all; quick: 2)"
    )
    parser.add_argument("--precisions", type=_names, help="32, 16-mixed, bf16-mixed (default: 32; on GPU all three)")
    parser.add_argument("--batch-sizes", type=_ints, help="global batch sizes (default: the workload's own)")
    parser.add_argument("--repeats", type=int, help="runs per row; the median is reported (default 3, quick 1)")
    parser.add_argument("--steps", type=int, help="timed optimizer steps per run (default 20, on GPU 100, quick 8)")
    parser.add_argument("--warmup", type=int, help="steps before the timed ones (default 5, on GPU 10, quick 2)")
    parser.add_argument("--threads", type=int, help="torch threads per process (default: 1 on CPU)")
    parser.add_argument("--accelerator", choices=["auto", "cpu", "gpu"], default="auto")
    parser.add_argument("--timeout", type=int, default=900, help="seconds before one run is stopped")
    parser.add_argument(
        "--startup-repeats",
        type=int,
        help="runs of `python -m src.cli fit --help` and of `import lightning.pytorch` (default 5, quick 3; 0: skip)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench_results"), help="output folder")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")
    return parser.parse_args(argv)


def default_devices(accelerator: str) -> list[int]:
    available = torch.cuda.device_count() if accelerator == "gpu" else len(os.sched_getaffinity(0))
    counts = [1]
    while counts[-1] * 2 <= min(available, 8):
        counts.append(counts[-1] * 2)
    return counts if available in counts or available > 8 else [*counts, available]


def supported(precision: str, accelerator: str) -> str | None:
    """Why a precision cannot run here, or None."""
    if accelerator == "gpu" and precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    return None


def chosen_workloads(args: argparse.Namespace) -> list[str]:
    workloads = args.workload or (["image"] if args.quick else list(WORKLOADS))
    unknown = [name for name in workloads if name not in WORKLOADS]
    if unknown:
        raise SystemExit(
            f"error: --workload {','.join(unknown)} is not a workload. Fix: choose from {', '.join(WORKLOADS)}."
        )
    return workloads


def chosen_strategies(args: argparse.Namespace) -> list[str]:
    """The strategies asked for, plus the baselines every table shows beside them, in the table's order."""
    wanted = set(args.strategies or STRATEGY_LABELS)
    unknown = sorted(wanted - set(STRATEGY_LABELS))
    if unknown:
        raise SystemExit(
            f"error: --strategies {','.join(unknown)} is not a strategy. Fix: choose from {', '.join(STRATEGY_LABELS)}."
        )
    wanted |= set(ONE_DEVICE_ROWS)
    if wanted & set(MULTIPROCESS):
        wanted |= set(MULTIPROCESS_BASELINES)
    return [strategy for strategy in STRATEGY_LABELS if strategy in wanted]


def plan(args: argparse.Namespace, accelerator: str, default_batch: dict[str, int]) -> tuple[list[Row], list[str]]:
    """The rows to run, and what was skipped and why; ``default_batch``: each workload's own global batch."""
    workloads = chosen_workloads(args)
    strategies = chosen_strategies(args)
    available = torch.cuda.device_count() if accelerator == "gpu" else len(os.sched_getaffinity(0))
    devices = args.devices or ([min(2, available)] if args.quick else default_devices(accelerator))
    default_precisions = ["32", "bf16-mixed", "16-mixed"] if accelerator == "gpu" and not args.quick else ["32"]
    precisions = [PRECISION_ALIASES.get(p, p) for p in (args.precisions or default_precisions)]
    skipped = [f"{n} devices: this machine has {available}" for n in devices if n > available]
    devices = [n for n in devices if n <= available]
    rows: list[Row] = []
    for workload in workloads:
        sizes = args.batch_sizes or [default_batch[workload]]
        for precision in precisions:
            reason = supported(precision, accelerator)
            if reason:
                skipped.append(f"{precision}: {reason}")
                continue
            for batch in sizes:
                for strategy in strategies:
                    counts = [1] if strategy in ONE_DEVICE_ROWS else devices
                    for n in counts:
                        processes = n if strategy in MULTIPROCESS else 1
                        if batch % processes:
                            skipped.append(f"{workload} {strategy} x{n} b{batch}: batch not divisible by {processes}")
                            continue
                        rows.append(Row(workload, strategy, n, precision, batch))
    return rows, skipped


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(dense peak FLOP/s of one device at this precision, where it comes from), from the table every run uses."""
    if device.type != "cuda":
        return None, "n/a (CPU)"
    name, peak = torch.cuda.get_device_name(device), dense_peak_flops(device, precision)
    if not peak:
        return None, f"{name}: unknown"
    return peak, f"{name}: dense {compute_kind(precision)} peak (src/callbacks/throughput.py)"


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    accelerator = args.accelerator
    if accelerator == "auto":
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    if accelerator == "gpu" and not torch.cuda.is_available():
        raise SystemExit("error: --accelerator=gpu, but PyTorch sees no CUDA GPU")
    # each workload built once, as `python -m src.cli fit` builds it: its batch size, tokens and FLOPs
    clis = {name: build_cli(WORKLOADS[name], args.quick) for name in chosen_workloads(args)}
    rows, skipped = plan(args, accelerator, {name: global_batch_size(cli) for name, cli in clis.items()})
    if not rows:
        raise SystemExit("error: nothing to run: " + "; ".join(skipped))
    largest = max(row.processes for row in rows)
    gpu = accelerator == "gpu"
    threads = args.threads or (1 if accelerator == "cpu" else max(1, (os.cpu_count() or 1) // largest))
    settings = Settings(
        accelerator=accelerator,
        quick=args.quick,
        # GPU steps take milliseconds: more of them, for the same few seconds of timed window
        warmup=max(1, args.warmup if args.warmup is not None else (2 if args.quick else 10 if gpu else 5)),
        steps=args.steps or (8 if args.quick else 100 if gpu else 20),
        threads=threads,
        timeout_s=args.timeout,
        out=args.out.resolve(),
    )
    repeats = args.repeats or (1 if args.quick else 3)
    environment = machine_info(argv)
    print(f"{len(rows)} rows x {repeats} repeat(s) on {accelerator}, {threads} thread(s) per process -> {settings.out}")
    for reason in skipped:
        print(f"skipped: {reason}")

    workload_info: dict[str, dict[str, Any]] = {}
    for name in {row.workload for row in rows}:
        workload_info[name] = {
            "description": WORKLOADS[name].description,
            "tokens_per_sample": tokens_per_sample(clis[name]),
            "flops_per_sample": flops_per_sample(clis[name]),
        }
    device = torch.device("cuda", 0) if accelerator == "gpu" else torch.device("cpu")
    peaks: dict[str, float | None] = {}
    peak_sources = {}
    for precision in {row.precision for row in rows}:
        peaks[precision], peak_sources[precision] = peak_flops(device, precision)

    started = time.time()
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` sends SIGTERM: still write what was measured
    results = run_all(rows, repeats, settings)
    startup_repeats = args.startup_repeats if args.startup_repeats is not None else (3 if args.quick else 5)
    startup = measure_startup(startup_repeats, run_env(threads)) if startup_repeats > 0 else None
    environment["load_average_end"] = load_average()
    environment["bench_wall_s"] = round(time.time() - started, 1)
    table = build_table(results, accelerator, workload_info, peaks)
    output = {
        "environment": environment,
        "settings": {
            "accelerator": accelerator,
            "quick": args.quick,
            "warmup": settings.warmup,
            "steps": settings.steps,
            "repeats": repeats,
            "threads": threads,
            "peak_flops_source": peak_sources,
            "skipped": skipped,
        },
        "workloads": workload_info,
        "rows": table,
        "startup": startup,
        "runs": {row.key: runs for row, runs in results.items()},
    }
    written = write_all(settings.out, output, plots=not args.no_plots)
    print((settings.out / "results.md").read_text())
    print("wrote " + ", ".join(str(path) for path in written))
    failed = [row["key"] for row in table if row.get("samples_per_s") is None]
    if failed:
        print(f"FAILED rows: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
