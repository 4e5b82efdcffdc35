"""What the results were measured on: machine, load, library versions, git commit and command."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from benchmarks import REPO


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: a busy machine shows here (other jobs share the cores)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info(command: list[str]) -> dict[str, Any]:
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    status = _git("status", "--porcelain")
    return {
        "command": " ".join(["python -m benchmarks", *command]),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_cores": cores,
        "cpu_cores_usable": usable,
        "memory_gib": _memory_gib(),
        "gpus": gpus,
        "cuda": torch.version.cuda if gpus else None,
        "cudnn": torch.backends.cudnn.version() if gpus else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "lightning": _version("lightning"),
        "torchmetrics": _version("torchmetrics"),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "load_average_start": load_average(),
    }
