"""Start-up: what a user waits for on every launch, against the floor of importing Lightning.

``python -m src.cli fit --help`` (imports, the CLI's parsers, every class's options) is timed beside
``python -c "import lightning.pytorch"`` on the same machine, interleaved, each in a fresh process; the time to
the first training step comes from the benchmark's rows (``startup_s``).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks import REPO

COMMANDS = {
    "cli_help": [sys.executable, "-m", "src.cli", "fit", "--help"],
    "import_lightning": [sys.executable, "-c", "import lightning.pytorch"],
}


def _wall_time(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def measure_startup(repeats: int, env: dict[str, str]) -> dict[str, Any]:
    """Median wall seconds of each command over ``repeats`` interleaved runs, and their ratio."""
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(repeats):
        for name, command in COMMANDS.items():
            times[name].append(_wall_time(command, env))
    medians = {f"{name}_s": statistics.median(values) for name, values in times.items()}
    return {
        **medians,
        "help_vs_import": medians["cli_help_s"] / medians["import_lightning_s"],
        "repeats": repeats,
        "runs_s": times,
    }
