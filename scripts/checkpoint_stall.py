"""What a checkpoint every step costs training, synchronous against asynchronous (``--checkpoint.async_save``).

    python scripts/checkpoint_stall.py --repeats 3
    python scripts/checkpoint_stall.py --repeats 3 --accelerator gpu        # the state on a GPU: pinned host copies
    python scripts/checkpoint_stall.py --repeats 3 --strategy fsdp2 --devices 2 --threads 1   # sharded saves

Trains the GPT preset (``configs/experiment/gpt.yaml``, by default 6 layers of width 384: 10.7M parameters) for
``--steps`` steps in three ways, each in a process of its own, the repeats interleaved: without per-step checkpoints
(``last.ckpt`` at the end only), and with ``--checkpoint.every_n_train_steps=1`` written synchronously and in the
background (for ``--strategy fsdp2``: a folder of shards per save, written by torch's ``dcp.save`` or, in the
background, ``dcp.async_save``). For each it reports the median and range over the repeats of

- the stall per save: the time the checkpoint callback's ``on_train_batch_end`` holds the training loop (a
  synchronous write, or a host copy plus the wait for a previous write still in progress), per step, on rank 0;
- the run: ``trainer.fit`` from start to return (the final checkpoint on disk), and its ratio to the run without
  per-step checkpoints.

The machine's load (``os.getloadavg``) before and after is printed with the figures: other processes on the cores
change them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: the ways a run checkpoints: name -> its extra flags
MODES = {
    "no per-step checkpoints": [],
    "every step, synchronous": ["--checkpoint.every_n_train_steps=1", "--checkpoint.async_save=false"],
    "every step, asynchronous": ["--checkpoint.every_n_train_steps=1", "--checkpoint.async_save=true"],
}


def one_run(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """Train once in this process; the figures of ``mode``."""
    sys.path.insert(0, str(REPO))
    import torch

    from multigpu.checkpoints.schedule import RunCheckpoint
    from src.cli import CLI

    torch.set_num_threads(args.threads)
    run_dir = args.run_dir  # one folder for every rank of the run
    flags = [
        "--config=configs/experiment/gpt.yaml",
        f"--model.n_layer={args.n_layer}", f"--model.n_embd={args.n_embd}", f"--model.n_head={args.n_head}",
        f"--data.batch_size={args.batch_size}", f"--trainer.accelerator={args.accelerator}",
        f"--trainer.devices={args.devices}", f"--trainer.strategy={args.strategy}",
        f"--trainer.max_steps={args.steps}", "--trainer.max_epochs=-1", "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0", f"--trainer.default_root_dir={run_dir}", "--progress_bar=none",
        "--trainer.enable_model_summary=false", *MODES[mode],
    ]  # fmt: skip
    cli = CLI(args=flags, run=False)
    trainer, model = cli.trainer, cli.model
    checkpoint = next(c for c in trainer.callbacks if isinstance(c, RunCheckpoint))
    stalls: list[float] = []
    hook = checkpoint.on_train_batch_end

    def timed_hook(*hook_args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        hook(*hook_args, **kwargs)
        stalls.append(time.perf_counter() - start)

    checkpoint.on_train_batch_end = timed_hook  # type: ignore[method-assign]
    start = time.perf_counter()
    trainer.fit(model, datamodule=cli.datamodule)
    total = time.perf_counter() - start
    files = [p for p in Path(run_dir, "checkpoints").rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return {
        "total_s": total, "stall_s": statistics.median(stalls[1:] or stalls), "files_bytes": size,
        "rank": trainer.global_rank,
    }  # fmt: skip


def summary(values: list[float], unit: str = "s", scale: float = 1.0) -> str:
    scaled = [v * scale for v in values]
    return f"{statistics.median(scaled):7.3f} {unit} (range {min(scaled):.3f} to {max(scaled):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    parser.add_argument("--accelerator", default="cpu", help="cpu or gpu (the state on a GPU)")
    parser.add_argument("--strategy", default="auto", help="auto (one device), or fsdp2 for sharded saves")
    parser.add_argument("--devices", type=int, default=1, help="processes (2 with fsdp2)")
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--one", choices=list(MODES), help=argparse.SUPPRESS)  # a run in this process
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)  # its folder (Lightning's launcher starts the other
    # ranks with this command line)
    args = parser.parse_args()
    if args.one:
        figures = one_run(args, args.one)
        if figures.pop("rank") == 0:
            print(json.dumps(figures))
        return
    passed = [
        f"--{name.replace('_', '-')}={value}"
        for name, value in vars(args).items()
        if name not in ("repeats", "one", "run_dir")
    ]
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    load_before = os.getloadavg()
    for _ in range(args.repeats):
        for mode in MODES:  # interleaved: a change of the machine's load touches every mode alike
            run_dir = tempfile.mkdtemp(prefix="checkpoint_stall_")
            command = [sys.executable, __file__, *passed, "--one", mode, f"--run-dir={run_dir}"]
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
            shutil.rmtree(run_dir, ignore_errors=True)
            if done.returncode != 0:
                raise SystemExit(f"{mode} failed:\n{done.stderr[-4000:]}")
            results[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    load_after = os.getloadavg()
    base = statistics.median(r["total_s"] for r in results["no per-step checkpoints"])
    sync_stall = statistics.median(r["stall_s"] for r in results["every step, synchronous"])
    print(
        f"\nGPT n_layer={args.n_layer} n_embd={args.n_embd} batch {args.batch_size}, {args.steps} steps,"
        f" {args.accelerator}, strategy {args.strategy} on {args.devices} process(es) of {args.threads} threads,"
        f" {args.repeats} repeats; load average (1, 5, 15 min)"
        f" {' '.join(f'{v:.2f}' for v in load_before)} before, {' '.join(f'{v:.2f}' for v in load_after)} after"
    )
    for mode, runs in results.items():
        stall = [r["stall_s"] for r in runs]
        totals = [r["total_s"] for r in runs]
        print(f"  {mode}:")
        print(f"    stall per save {summary(stall, 'ms', 1000)}  ({statistics.median(stall) / sync_stall:.0%} of sync)")
        print(f"    run            {summary(totals)}  ({statistics.median(totals) / base:.2f}x the run without)")
    size = results["every step, synchronous"][0]["files_bytes"] / 2**20
    print(f"  checkpoint files at the end (every rank's): {size:.0f} MiB")


if __name__ == "__main__":
    main()
