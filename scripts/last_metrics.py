"""The last logged value of each metric of a run: ``python scripts/last_metrics.py RUN_DIR [--out FILE.json]``.

Reads ``RUN_DIR/logs/version_*/metrics.csv`` (the CSV logger of ``configs/default.yaml``, latest version), prints
one ``name value`` line per metric and writes them as JSON to ``--out``. Exit status 1 when the run logged nothing
or a loss is not finite (a run that trained to NaN has not passed).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path


def last_values(run_dir: Path) -> dict[str, float]:
    versions = sorted((run_dir / "logs").glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:]))
    if not versions:
        return {}
    last: dict[str, float] = {}
    with open(versions[-1]) as handle:
        for row in csv.DictReader(handle):
            last.update({key: float(value) for key, value in row.items() if value not in (None, "")})
    return last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    values = last_values(args.run_dir)
    for key, value in sorted(values.items()):
        print(f"{key} {value:.6g}")
    if args.out:
        args.out.write_text(json.dumps(values, indent=2) + "\n")
    bad = [key for key, value in values.items() if "loss" in key and not math.isfinite(value)]
    if not values or bad:
        print(f"{args.run_dir}: {'no metrics logged' if not values else 'not finite: ' + ', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
