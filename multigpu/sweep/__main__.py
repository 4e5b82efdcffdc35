"""``python -m multigpu.sweep run SWEEP.yaml --dir DIR [--trials N] [--workers K] [-- fit args]`` and
``python -m multigpu.sweep report DIR``; see docs/sweeps.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from multigpu.command import prog
from multigpu.sweep.spec import SweepError


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python -m multigpu.sweep", description=f"Hyperparameter sweeps over `{prog()} fit` runs (Optuna)."
    )
    commands = main.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run the sweep's trials (resumes a stopped sweep; extends it with a larger --trials)",
        epilog=f"Arguments after `--` go to every trial's `{prog()} fit`, after the sweep file's `fit`.",
    )
    run.add_argument("sweep", type=Path, help="the sweep file (configs/sweep/*.yaml)")
    run.add_argument("--dir", type=Path, required=True, help="the sweep directory: journal, one run dir per trial")
    run.add_argument("--trials", type=int, default=None, help="trials in all (default: the sweep file's)")
    run.add_argument("--workers", type=int, default=1, help="trials at once on this machine (default 1)")
    run.add_argument(
        "--launcher", default="", help="command prefix of every fit run, e.g. 'srun --cpus-per-task=8' in a job"
    )
    report = commands.add_parser("report", help="write DIR/leaderboard.csv, .md and .png; print the best config")
    report.add_argument("dir", type=Path, help="the sweep directory")
    report.add_argument("--no-plot", action="store_true", help="skip the plot (no matplotlib needed)")
    return main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # everything after `--` belongs to fit, even options that look like ours
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    args = parser().parse_args(argv)
    try:
        if args.command == "report":
            from multigpu.sweep.report import report

            report(args.dir, plot_file=not args.no_plot)
            return 0
        from multigpu.sweep import spec
        from multigpu.sweep.runner import run, with_trials

        return run(with_trials(spec.load(args.sweep), args.trials), args.dir, args.workers, extra, args.launcher)
    except SweepError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
