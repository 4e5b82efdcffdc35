"""``python -m benchmarks``: the template's strategies against bare Lightning and plain PyTorch, in one command.

Examples, run from the repository root (the folder that holds benchmarks/ and src/)::

    python -m benchmarks --quick                      # about two minutes on a 2-core CPU
    python -m benchmarks                              # both workloads, every strategy, 1..N devices, 3 repeats
    python -m benchmarks --workload image --strategies ddp,plain-ddp --devices 1,2 --batch-sizes 16,64,256
    python -m benchmarks --model=my_project.models.Net --data=my_project.data.Data --quick   # your own model
    python -m benchmarks --config configs/experiment/mine.yaml --devices 1,2                 # ... from a config

Rows: ``single`` (one device), ``dp``, ``ddp``, ``ddp_spawn`` (the template through ``python -m src.cli fit``;
``fsdp2`` and ``tensor_parallel`` when ``--strategies`` names them),
``bare-lightning``, ``bare-lightning-ddp`` (a minimal LightningModule and a plain ``L.Trainer``) and
``plain-loop``, ``plain-ddp`` (hand-written PyTorch). On a CPU, devices are processes with a fixed number of
threads each, DDP uses gloo, and ``dp`` is a pass-through (one process). Results go to ``--out``:
``results.json``, ``results.csv``, ``results.md`` and two PNG plots: figures, without verdicts (the project's
targets for its own workloads are in docs/benchmarks.md).

Your own model (``--model``, ``--data``, ``--config``, as ``python -m src.cli fit`` takes them) gets the same rows,
with your LightningModule and data module in a plain ``L.Trainer`` as bare Lightning; its plain PyTorch rows read
"n/a" (the plain loop re-implements the built-in workloads' training step). Throughput is in samples/s (tokens/s
for the built-in language model); TFLOP/s and MFU where the module declares ``flops_per_sample`` or
``flops_per_batch``. Beside peak memory, each row shows the parameters + gradients + optimizer state that one
rank holds (sharded under ``fsdp2`` and ``tensor_parallel``); ``--memory-budget-mb`` marks the rows over it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from itertools import product
from pathlib import Path
from typing import Any, NoReturn

import torch

from benchmarks.environment import load_average, machine_info
from benchmarks.report import build_table, write_all
from benchmarks.runner import (
    MULTIPROCESS,
    MULTIPROCESS_BASELINES,
    ONE_DEVICE_ROWS,
    OPT_IN,
    STRATEGY_LABELS,
    Row,
    Settings,
    run_all,
    run_env,
)
from benchmarks.startup import measure_startup
from benchmarks.workloads import (
    EXAMPLE_FILES,
    WORKLOADS,
    Workload,
    add_workload_arguments,
    build_cli,
    global_batch_size,
    has_batch_size,
    named,
    tokens_per_sample,
    training_flops,
    user_workload,
    with_model,
)
from multigpu.observe.throughput import compute_kind, dense_peak_flops

PRECISION_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}


class UsageError(SystemExit):
    """A wrong option or a missing workload: one paragraph on stderr and exit status 2, nothing run."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = 2

    def __str__(self) -> str:
        return self.message


def fail(message: str) -> NoReturn:
    raise UsageError(f"error: {message}")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Training throughput of the template's strategies against bare Lightning and plain PyTorch.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--quick", action="store_true", help="small models, few steps, one repeat: about two minutes")
    parser.add_argument(
        "--workload",
        type=_names,
        help=f"built-in workloads, comma-separated: {', '.join(WORKLOADS)} (default: all, quick: image; with"
        " --model/--data/--config: none unless named)",
    )
    add_workload_arguments(parser)
    parser.add_argument(
        "--strategies",
        type=_names,
        help=f"comma-separated from {', '.join(STRATEGY_LABELS)} (default: all but {', '.join(OPT_IN)}); the"
        f" 1-device rows ({', '.join(ONE_DEVICE_ROWS)}) are always added, and with any multi-process row"
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
    parser.add_argument(
        "--memory-budget-mb",
        type=float,
        metavar="MB",
        help="mark each row whose parameters + gradients + optimizer state per rank exceed MB as 'over budget'"
        " (on a CPU a budget you set, not a device limit)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench_results"), help="output folder")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")
    return parser.parse_args(argv)


def default_devices(accelerator: str) -> list[int]:
    """1, 2, 4, ... up to all devices of the machine (at most 8), and all of them."""
    available = _available(accelerator)
    counts = [1]
    while counts[-1] * 2 <= min(available, 8):
        counts.append(counts[-1] * 2)
    return counts if available in counts or available > 8 else [*counts, available]


def supported(precision: str, accelerator: str) -> str | None:
    """Why a precision cannot run here, or None."""
    if accelerator == "gpu" and precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    return None


HOW_TO_NAME_ONE = (
    "Fix: name your own model, as `python -m src.cli fit` takes it: `python -m benchmarks --model=PKG.Class"
    " --data=PKG.Class` (a LightningModule and a LightningDataModule with a batch_size argument) or"
    " `python -m benchmarks --config FILE` (a config naming model and data), with --quick for a short run."
)


def chosen_workloads(args: argparse.Namespace) -> list[Workload]:
    """The workloads to run: the user's (``--model``/``--data``/``--config``) and the built-in ones asked for.

    Without a user's model, the default is every built-in workload (``--quick``: image) that this copy of the
    template still has; none left is an error that says how to name a model.
    """
    user = user_workload(getattr(args, "model", None), getattr(args, "data", None), getattr(args, "config", None))
    if user is not None:
        missing = [path for path in user.configs if not Path(path).is_file()]
        if missing:
            fail(f"--config {missing[0]} does not exist. Fix: give the path of a `python -m src.cli fit` config file.")
    unknown = [name for name in args.workload or () if name not in WORKLOADS]
    if unknown:
        fail(f"--workload {','.join(unknown)} is not a workload. Fix: choose from {', '.join(WORKLOADS)}.")
    removed = [name for name in args.workload or () if not WORKLOADS[name].available()]
    if removed:
        fail(
            f"--workload {','.join(removed)}: the built-in workload was removed from this copy of the template"
            f" ({', '.join(WORKLOADS[removed[0]].missing())} not found). {HOW_TO_NAME_ONE}"
        )
    if args.workload:
        names = args.workload
    elif user is not None:
        names = []
    else:
        names = [name for name in (["image"] if args.quick else WORKLOADS) if WORKLOADS[name].available()]
        if not names:
            fail(
                "no workload to measure: the built-in workloads (the example image and language models:"
                f" {', '.join(EXAMPLE_FILES)}) were removed from this copy of the template, and no model was named."
                f" {HOW_TO_NAME_ONE}"
            )
    return ([user] if user is not None else []) + [WORKLOADS[name] for name in names]


def chosen_strategies(args: argparse.Namespace) -> list[str]:
    """The strategies asked for, plus the baselines every table shows beside them, in the table's order."""
    wanted = set(args.strategies or (name for name in STRATEGY_LABELS if name not in OPT_IN))
    unknown = sorted(wanted - set(STRATEGY_LABELS))
    if unknown:
        fail(f"--strategies {','.join(unknown)} is not a strategy. Fix: choose from {', '.join(STRATEGY_LABELS)}.")
    wanted |= set(ONE_DEVICE_ROWS)
    if wanted & set(MULTIPROCESS):
        wanted |= set(MULTIPROCESS_BASELINES)
    return [strategy for strategy in STRATEGY_LABELS if strategy in wanted]


def _available(accelerator: str) -> int:
    return torch.cuda.device_count() if accelerator == "gpu" else len(os.sched_getaffinity(0))


def _precisions(args: argparse.Namespace, accelerator: str) -> list[str]:
    default = ["32", "bf16-mixed", "16-mixed"] if accelerator == "gpu" and not args.quick else ["32"]
    return [PRECISION_ALIASES.get(p, p) for p in (args.precisions or default)]


def plan(
    args: argparse.Namespace,
    accelerator: str,
    default_batch: dict[str, int],
    workloads: list[str] | None = None,
) -> tuple[list[Row], list[str]]:
    """The rows to run, and what was skipped and why; ``default_batch``: each workload's own global batch.

    ``workloads``: the names of the workloads (default: the built-in ones ``args`` asks for).
    """
    workloads = workloads if workloads is not None else [w.name for w in chosen_workloads(args)]
    strategies = chosen_strategies(args)
    available = _available(accelerator)
    devices = args.devices or ([min(2, available)] if args.quick else default_devices(accelerator))
    skipped = [f"{n} devices: this machine has {available}" for n in devices if n > available]
    devices = [n for n in devices if n <= available]
    wanted = _precisions(args, accelerator)
    skipped += [f"{p}: {supported(p, accelerator)}" for p in wanted if supported(p, accelerator)]
    precisions = [p for p in wanted if not supported(p, accelerator)]
    rows: list[Row] = []
    for workload in workloads:
        batches = args.batch_sizes or [default_batch[workload]]
        for precision, batch, strategy in product(precisions, batches, strategies):
            for n in [1] if strategy in ONE_DEVICE_ROWS else devices:
                row = Row(workload, strategy, n, precision, batch)
                if batch % row.processes:
                    skipped.append(f"{workload} {strategy} x{n} b{batch}: batch not divisible by {row.processes}")
                else:
                    rows.append(row)
    return rows, skipped


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(dense peak FLOP/s of one device at this precision, where it comes from), from the table every run uses."""
    if device.type != "cuda":
        return None, "n/a (CPU)"
    name, peak = torch.cuda.get_device_name(device), dense_peak_flops(device, precision)
    if not peak:
        return None, f"{name}: unknown"
    return peak, f"{name}: dense {compute_kind(precision)} peak (multigpu/observe/throughput.py)"


def chosen_accelerator(requested: str) -> str:
    """``cpu`` or ``gpu``: ``auto`` is the GPU where PyTorch sees one."""
    if requested == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if requested == "gpu" and not torch.cuda.is_available():
        fail("--accelerator=gpu, but PyTorch sees no CUDA GPU. Fix: --accelerator=cpu, or run on a GPU machine.")
    return requested


def built_workloads(args: argparse.Namespace) -> tuple[dict[str, Workload], dict[str, Any]]:
    """Each workload asked for, built once as ``python -m src.cli fit`` builds it (its batch, tokens, FLOPs), by
    name, and its CLI; a user's data module without ``batch_size`` is refused."""
    workloads: dict[str, Workload] = {}
    clis: dict[str, Any] = {}
    for workload in chosen_workloads(args):
        cli = build_cli(workload, args.quick)
        if not workload.builtin and not has_batch_size(cli):
            fail(
                f"the data module {type(cli.datamodule).__qualname__} has no batch_size argument; the benchmark"
                " sets every row's batch through it (--batch-sizes, the same global batch on any device count)."
                " Fix: give it a batch_size argument, or subclass multigpu.data.base.GlobalBatchDataModule (whose"
                " batch_size is the global batch)."
            )
        workload = with_model(named(workload, cli), cli)
        workloads[workload.name], clis[workload.name] = workload, cli
    return workloads, clis


def run_settings(args: argparse.Namespace, accelerator: str, rows: list[Row], workloads: dict[str, Any]) -> Settings:
    """How every row runs: warm-up and timed steps (more on a GPU, fewer with ``--quick``), threads, timeout."""
    gpu = accelerator == "gpu"
    largest = max(row.processes for row in rows)
    warmup = args.warmup if args.warmup is not None else (2 if args.quick else 10 if gpu else 5)
    return Settings(
        accelerator=accelerator,
        quick=args.quick,
        # GPU steps take milliseconds: more of them, for the same few seconds of timed window
        warmup=max(1, warmup),
        steps=args.steps or (8 if args.quick else 100 if gpu else 20),
        threads=args.threads or (1 if not gpu else max(1, (os.cpu_count() or 1) // largest)),
        timeout_s=args.timeout,
        out=args.out.resolve(),
        workloads=workloads,
    )


def workload_info(rows: list[Row], workloads: dict[str, Workload], clis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What the report says of each workload measured: description, batch convention, tokens and FLOPs."""
    info = {}
    for name in dict.fromkeys(row.workload for row in rows):
        workload, cli = workloads[name], clis[name]
        info[name] = {
            "description": workload.description,
            "builtin": workload.builtin,
            "arguments": workload.arguments() if not workload.builtin else None,
            "batch_per_process": workload.batch_per_process,
            # tokens/s only where a sample is a sequence of a known length: the built-in language model
            "tokens_per_sample": tokens_per_sample(cli) if workload.counts_tokens else None,
            **training_flops(cli, workload),
        }
    return info


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.memory_budget_mb is not None and args.memory_budget_mb <= 0:
        fail(f"--memory-budget-mb {args.memory_budget_mb:g} is not a budget. Fix: give a positive number of MB.")
    accelerator = chosen_accelerator(args.accelerator)
    workloads, clis = built_workloads(args)
    batches = {name: global_batch_size(cli) for name, cli in clis.items()}
    rows, skipped = plan(args, accelerator, batches, list(workloads))
    if not rows:
        fail("nothing to run: " + "; ".join(skipped) + ". Fix: choose --devices and --batch-sizes that fit.")
    settings = run_settings(args, accelerator, rows, workloads)
    repeats = args.repeats or (1 if args.quick else 3)
    environment = machine_info(argv)
    print(
        f"{len(rows)} rows x {repeats} repeat(s) on {accelerator}, {settings.threads} thread(s) per process ->",
        settings.out,
    )
    for reason in skipped:
        print(f"skipped: {reason}")
    device = torch.device("cuda", 0) if accelerator == "gpu" else torch.device("cpu")
    peaks = {precision: peak_flops(device, precision) for precision in {row.precision for row in rows}}

    started = time.time()
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` sends SIGTERM: still write what was measured
    results = run_all(rows, repeats, settings)
    startup_repeats = args.startup_repeats if args.startup_repeats is not None else (3 if args.quick else 5)
    startup = measure_startup(startup_repeats, run_env(settings.threads)) if startup_repeats > 0 else None
    environment.update(load_average_end=load_average(), bench_wall_s=round(time.time() - started, 1))
    info = workload_info(rows, workloads, clis)
    peak = {precision: value for precision, (value, _) in peaks.items()}
    table = build_table(results, accelerator, info, peak, memory_budget_mb=args.memory_budget_mb)
    output = {
        "environment": environment,
        "settings": {
            **{key: getattr(settings, key) for key in ("accelerator", "quick", "warmup", "steps", "threads")},
            "repeats": repeats,
            "memory_budget_mb": args.memory_budget_mb,
            "peak_flops_source": {precision: source for precision, (_, source) in peaks.items()},
            "skipped": skipped,
        },
        "workloads": info,
        "rows": table,
        "startup": startup,
        "runs": {row.key: runs for row, runs in results.items()},
    }
    return finish(settings.out, output, plots=not args.no_plots)


def finish(out: Path, output: dict[str, Any], plots: bool) -> int:
    """Write the results and print the report; exit status 1 if a row failed."""
    written = write_all(out, output, plots=plots)
    print((out / "results.md").read_text())
    print("wrote " + ", ".join(str(path) for path in written))
    failed = [row["key"] for row in output["rows"] if row["status"] == "failed"]
    if failed:
        print(f"FAILED rows: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def entry(argv: list[str] | None = None) -> int:
    """``main``, with a usage error printed as its paragraph and exit status 2."""
    try:
        return main(argv)
    except UsageError as error:
        print(error.message, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(entry())
