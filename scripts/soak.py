"""The README's test command, several times in a row, while busy loops load every core: a race that a loaded CI
machine exposes shows here first.

    python scripts/soak.py                 # 3 runs of `python -m pytest`, under 2 busy loops
    python scripts/soak.py --runs 5 --load 4 -- tests/faults   # pytest's arguments after --

Prints each run's summary line and time, then every test that failed or errored, with its test id and the runs it
failed in; the output of a run with a failure is kept (its path printed). Exit status 1 if any run failed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: pytest's short summary (``-ra``, on in pyproject.toml): ``FAILED tests/x.py::test - reason``, ``ERROR ...``
OUTCOME = re.compile(r"^(FAILED|ERROR) (\S+)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--load", type=int, default=2, help="busy loops beside the suite (one per core)")
    parser.add_argument("pytest_args", nargs="*", help="added to `python -m pytest` (after --)")
    options = parser.parse_args(argv)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(options.load)]
    failed: dict[str, list[int]] = defaultdict(list)
    green = 0
    try:
        for run in range(1, options.runs + 1):
            start = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "pytest", *options.pytest_args], cwd=REPO, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
            lines = done.stdout.splitlines()
            summary = lines[-1] if lines else "(no output)"
            print(f"run {run}: exit {done.returncode} in {time.monotonic() - start:.0f} s: {summary}", flush=True)
            for line in lines:
                if match := OUTCOME.match(line):
                    failed[f"{match[1]} {match[2]}"].append(run)
            if done.returncode == 0:
                green += 1
            else:
                kept = Path(tempfile.mkstemp(prefix=f"soak-run{run}.", suffix=".log")[1])
                kept.write_text(done.stdout)
                print(f"  its output: {kept}", flush=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print(f"{green} of {options.runs} runs green under {options.load} busy loop(s)")
    for test, runs in sorted(failed.items()):
        print(f"  {test} (run {', '.join(map(str, runs))})")
    return 0 if green == options.runs else 1


if __name__ == "__main__":
    sys.exit(main())
