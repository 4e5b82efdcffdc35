"""Where the template's per-step DDP overhead goes: the benchmark's ddp rows, and the template without its vote.

    python scripts/ddp_overhead.py --batch-size 32 --rounds 4 --steps 40

Runs, interleaved for ``--rounds`` rounds, the benchmark's template ``ddp`` command (2 CPU processes), the same
with the template's preemption vote removed (a monkeypatch applied by a small launcher module; for measurement
only), bare Lightning DDP and plain PyTorch DDP; prints the median over rounds of each variant's mean step time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.clock import T0_ENV, rank_path  # noqa: E402
from benchmarks.runner import Row, Settings, baseline_command, run_env, template_command  # noqa: E402
from benchmarks.stats import summarise_run  # noqa: E402

NO_VOTE = (
    "from multigpu.faults import preemption\n"
    "preemption.PreemptionCheckpoint.on_train_batch_end = lambda *a, **k: None\n"
)
PATCHES = {"no preemption vote": NO_VOTE}
#: the baselines, by the benchmark's strategy name
BASELINES = {"bare Lightning DDP": "bare-lightning-ddp", "plain PyTorch DDP": "plain-ddp"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="image", choices=["image", "gpt"])
    parser.add_argument("--batch-size", type=int, default=32, help="global batch (2 processes share it)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run (after 5 warm-up steps)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ddp_overhead_"))
    launchers = {}
    for name, patch in PATCHES.items():
        launchers[name] = work / f"launch_{len(launchers)}.py"
        launchers[name].write_text(f"import sys\n{patch}from src.cli import main\nmain(sys.argv[1:])\n")
    settings = Settings(accelerator="cpu", quick=False, warmup=5, steps=args.steps, threads=1, timeout_s=600, out=work)
    times: dict[str, list[float]] = {}
    for round_index in range(args.rounds):
        for variant in ("template", *PATCHES, *BASELINES):
            baseline = variant in BASELINES
            row = Row(args.workload, BASELINES.get(variant, "ddp"), 2, "32-true", args.batch_size)
            run_dir = work / f"{len(times.get(variant, []))}-{variant.replace(' ', '_')}"
            run_dir.mkdir(parents=True, exist_ok=True)
            timings = run_dir / "timings.json"
            command = (
                baseline_command(row, settings, timings)
                if baseline
                else template_command(row, settings, timings, run_dir)
            )
            if variant in launchers:  # `python -m src.cli fit ...` -> `python launcher.py fit ...`
                command = [sys.executable, str(launchers[variant]), *command[3:]]
            env = run_env(1) | {T0_ENV: repr(time.time()), "PYTHONPATH": str(REPO)}
            result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False)
            if result.returncode:
                sys.exit(f"{variant} failed:\n{result.stderr[-3000:]}")
            summary = summarise_run([json.loads(rank_path(timings, 0).read_text())], settings.warmup, args.batch_size)
            times.setdefault(variant, []).append(1000 * args.batch_size / summary["samples_per_s"])
            print(f"round {round_index + 1} {variant}: {times[variant][-1]:.1f} ms", flush=True)
    print(f"\n{args.workload}, 2 processes, global batch {args.batch_size}: mean step, median of {args.rounds} rounds")
    for variant, values in times.items():
        print(f"  {variant:22s} {statistics.median(values):7.1f} ms   ({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
