"""Runs the rows of the benchmark, each in fresh processes, and collects what their timers wrote.

Each run is one subprocess tree: ``python -m src.cli fit`` with the ``StepTimer`` callback for the template rows,
``python -m benchmarks.plain`` for the baselines (plain PyTorch and bare Lightning). Every process gets the same,
fixed thread count through ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` (Lightning leaves the count alone when it is
set). Repeats go round robin over the rows, so slow drift of a shared machine spreads over all rows instead of
landing on one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.clock import T0_ENV, rank_path
from benchmarks.environment import load_average
from benchmarks.stats import summarise_run
from benchmarks.workloads import WORKLOADS, Workload, cli_flags
from multigpu.strategies.pipeline import PipelineOptions, bubble_fraction

#: what each strategy of a row means; "bare-*" and "plain-*" are the baselines
STRATEGY_LABELS = {
    "single": "template, 1 device",
    "dp": "template, dp",
    "ddp": "template, ddp",
    "ddp_spawn": "template, ddp_spawn",
    "fsdp2": "template, fsdp2 (sharded)",
    "tensor_parallel": "template, tensor_parallel (split layers)",
    "pipeline": "template, pipeline (layers in stages, 1f1b)",
    "bare-lightning": "bare Lightning",
    "bare-lightning-ddp": "bare Lightning, ddp",
    "plain-loop": "plain PyTorch loop",
    "plain-ddp": "plain PyTorch DDP (mp.spawn)",
}
#: each implementation's 1-device row, which every table shows and its scaling efficiency is measured against;
#: then the baselines' multi-process rows
ONE_DEVICE_ROW = {"template": "single", "bare": "bare-lightning", "plain": "plain-loop"}
ONE_DEVICE_ROWS = tuple(ONE_DEVICE_ROW.values())
MULTIPROCESS_BASELINES = ("bare-lightning-ddp", "plain-ddp")
MODEL_PARALLEL = ("fsdp2", "tensor_parallel", "pipeline")
MULTIPROCESS = ("ddp", "ddp_spawn", *MODEL_PARALLEL, *MULTIPROCESS_BASELINES)
#: rows run only when ``--strategies`` names them (not part of "all"): they are for models that do not fit one device
OPT_IN = MODEL_PARALLEL
#: how ``python -m benchmarks.plain`` runs each baseline (``--mode``)
BASELINE_MODES = {
    "plain-loop": "loop",
    "plain-ddp": "ddp",
    "bare-lightning": "lightning",
    "bare-lightning-ddp": "lightning",
}
#: what the plain PyTorch rows of a user's model say: the plain loop re-implements the built-in workloads' steps
NO_PLAIN_BASELINE = "n/a: plain PyTorch baseline exists only for the built-in workloads"


@dataclass(frozen=True)
class Row:
    """One configuration of the benchmark."""

    workload: str
    strategy: str
    devices: int
    precision: str
    batch_size: int

    @property
    def implementation(self) -> str:
        """``template``, ``bare`` (bare Lightning) or ``plain`` (plain PyTorch)."""
        return self.strategy.split("-")[0] if self.strategy in BASELINE_MODES else "template"

    @property
    def processes(self) -> int:
        return self.devices if self.strategy in MULTIPROCESS else 1

    @property
    def key(self) -> str:
        return f"{self.workload}-{self.strategy}-{self.devices}dev-{self.precision}-b{self.batch_size}"


@dataclass(frozen=True)
class Settings:
    """How every row is run."""

    accelerator: str  # "cpu" or "gpu"
    quick: bool
    warmup: int
    steps: int
    threads: int
    timeout_s: int
    out: Path
    #: every workload of the rows, by name: the built-in ones and a user's
    workloads: dict[str, Workload] = field(default_factory=lambda: dict(WORKLOADS))


def not_applicable(row: Row, workload: Workload) -> str | None:
    """Why a row cannot be run for this workload (shown in its place), or None."""
    if row.implementation == "plain" and not workload.builtin:
        return NO_PLAIN_BASELINE
    if row.strategy == "tensor_parallel" and not workload.tensor_parallel_plan:
        return (
            f"n/a: {workload.model_name or workload.name} has no configure_model hook, so no tensor-parallel plan"
            " (fsdp2 shards any model)"
        )
    if row.strategy == "pipeline" and not workload.pipeline_stages:
        return f"n/a: {workload.model_name or workload.name} has no pipeline_stage hook (multigpu/strategies/pipeline/)"
    return None


def pipeline_shape(row: Row) -> tuple[int, int]:
    """(stages, micro-batches) of a pipeline row: one stage per process, the strategy's default micro-batches."""
    return row.processes, PipelineOptions().micro_batches


def theoretical_bubble(row: Row) -> float | None:
    """The share of a step each stage of a pipeline row idles in theory (None for the other rows)."""
    return bubble_fraction(*pipeline_shape(row)) if row.strategy == "pipeline" else None


def note(row: Row, accelerator: str) -> str:
    """What the reader must know about a row."""
    if row.strategy == "dp" and accelerator == "cpu":
        return "pass-through on CPU: one process, one device (DataParallel splits across GPUs only)"
    if row.strategy == "dp" and row.devices == 1:
        return "dp on one GPU is a single device"
    if row.strategy == "tensor_parallel":
        return "one node: the processes split each layer and all see the whole batch (data-parallel size 1)"
    if row.strategy == "pipeline":
        stages, micro_batches = pipeline_shape(row)
        return (
            f"{stages} stages, {micro_batches} micro-batches: each stage idles {theoretical_bubble(row):.0%} of a step"
            " in theory ((stages - 1) / (micro_batches + stages - 1); measured: 'Pipeline bubble' below); all see the"
            " whole batch"
        )
    if row.precision == "16-mixed" and accelerator == "cpu":
        return "Lightning runs 16-mixed as bf16-mixed on a CPU"
    return ""


def template_command(row: Row, settings: Settings, json_path: Path, run_dir: Path) -> list[str]:
    strategy = "auto" if row.strategy == "single" else row.strategy
    devices = 1 if row.strategy == "single" else row.devices
    workload = settings.workloads[row.workload]
    extra = {"data.init_args.batch_size": workload.data_batch_size(row.batch_size, row.processes)}
    return [
        sys.executable,
        "-m",
        "src.cli",
        "fit",
        *cli_flags(workload, settings.quick, extra),
        f"--trainer.accelerator={settings.accelerator}",
        f"--trainer.devices={devices}",
        f"--trainer.strategy={strategy}",
        f"--trainer.precision={row.precision}",
        f"--trainer.max_steps={settings.warmup + settings.steps}",
        "--trainer.max_epochs=-1",
        # validation (and the sanity check) stays out of the timed window; checkpoints are written after it
        "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0",
        f"--trainer.default_root_dir={run_dir}",
        "--trainer.callbacks+=benchmarks.timing.StepTimer",
        f"--trainer.callbacks.path={json_path}",
    ]


def baseline_command(row: Row, settings: Settings, json_path: Path) -> list[str]:
    workload = settings.workloads[row.workload]
    command = [
        sys.executable,
        "-m",
        "benchmarks.plain",
        *workload.arguments(),
        f"--mode={BASELINE_MODES[row.strategy]}",
        f"--devices={row.processes}",
        f"--accelerator={settings.accelerator}",
        f"--precision={row.precision}",
        f"--batch-size={row.batch_size}",
        f"--data-batch-size={workload.data_batch_size(row.batch_size, row.processes)}",
        f"--steps={settings.warmup + settings.steps}",
        f"--threads={settings.threads}",
        f"--out={json_path}",
    ]
    return [*command, "--quick"] if settings.quick else command


def run_env(threads: int) -> dict[str, str]:
    """The environment of a run: the repo and the launching folder importable (a user's package may live in
    either), fixed threads, no cluster or logger variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PL_", "WANDB_"))}
    paths = dict.fromkeys([str(REPO), os.getcwd(), *env.get("PYTHONPATH", "").split(os.pathsep)])
    env.update(
        PYTHONPATH=os.pathsep.join(path for path in paths if path),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
        WANDB_MODE="offline",
    )
    return env


def launch(command: list[str], settings: Settings, log: Path) -> int | None:
    """Run one command tree from the repository root, its output to ``log``; its exit code, None if timed out."""
    env = run_env(settings.threads)
    env[T0_ENV] = repr(time.time())
    with open(log, "w") as handle:
        # a session of its own, so that a run past its timeout is ended with all the processes it started
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return process.wait(timeout=settings.timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if process.poll() is None:  # timed out, or the benchmark itself was interrupted
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def run_once(row: Row, repeat: int, settings: Settings) -> dict[str, Any]:
    """Run one repeat of a row; returns its figures, or ``{"error": ...}`` with the end of its log."""
    run_dir = settings.out / "runs" / f"{row.key}-r{repeat}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    json_path = run_dir / "timing.json"
    if row.implementation == "template":
        command = template_command(row, settings, json_path, run_dir)
    else:
        command = baseline_command(row, settings, json_path)
    (run_dir / "command.txt").write_text(" ".join(command) + "\n")
    started = time.perf_counter()
    returncode = launch(command, settings, run_dir / "output.log")
    wall_s = time.perf_counter() - started
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # not results, and written after the timed window
    result: dict[str, Any] = {"repeat": repeat, "wall_s": wall_s, "run_dir": str(run_dir), "load_after": load_average()}
    paths = [rank_path(json_path, rank) for rank in range(row.processes)]
    if returncode != 0 or not all(path.is_file() for path in paths):
        tail = (run_dir / "output.log").read_text(errors="replace")[-2000:]
        reason = "timed out" if returncode is None else f"exit code {returncode}"
        return {**result, "error": f"{reason}; log: {run_dir / 'output.log'}", "log_tail": tail}
    try:
        return {
            **result,
            **summarise_run([json.loads(path.read_text()) for path in paths], settings.warmup, row.batch_size),
        }
    except ValueError as error:
        return {**result, "error": str(error)}


def run_all(
    rows: list[Row], repeats: int, settings: Settings, progress: Callable[[str], None] = print
) -> dict[Row, list[dict[str, Any]]]:
    """All repeats of all rows, round robin: repeat 1 of every row, then repeat 2, ...

    Interrupted (Ctrl-C, or SIGTERM from ``timeout``), it stops and returns the runs finished so far.
    """
    results: dict[Row, list[dict[str, Any]]] = {row: [] for row in rows}
    runnable = []
    for row in rows:
        reason = not_applicable(row, settings.workloads[row.workload])
        if reason:
            results[row].append({"not_applicable": reason})  # shown in the table in the row's place
            progress(f"{row.key}: {reason}")
        else:
            runnable.append(row)
    total, done = len(runnable) * repeats, 0
    for repeat in range(1, repeats + 1):
        for row in runnable:
            done += 1
            try:
                run = run_once(row, repeat, settings)
            except KeyboardInterrupt:
                progress(f"interrupted at run {done}/{total}: reporting the runs finished so far")
                return results
            results[row].append(run)
            if "error" in run:
                progress(f"[{done}/{total}] {row.key} repeat {repeat}: FAILED ({run['error']})")
            else:
                progress(
                    f"[{done}/{total}] {row.key} repeat {repeat}: {run['samples_per_s']:.1f} samples/s,"
                    f" step {run['step_ms_median']:.2f} ms median, first step after {run['startup_s']:.1f} s"
                    f" ({run['wall_s']:.0f} s)"
                    + (f", bubble {run['bubble_measured']:.0%}" if run.get("bubble_measured") is not None else "")
                )
    return results


def row_dict(row: Row) -> dict[str, Any]:
    return {**asdict(row), "implementation": row.implementation, "processes": row.processes, "key": row.key}
