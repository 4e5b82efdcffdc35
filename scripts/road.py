"""The road a ``fit`` takes through the engine before its first ``training_step``: every module of ``multigpu/`` whose
code runs, in the order the run first reaches it, with how many of its functions ran.

    python scripts/road.py [FIT ARGS ...]      (default: the tests' tiny workload, one step)

Counts code that runs, not modules that are imported: a module whose functions never run on the way is not on the
road, however many imports name it. ``READING`` is the eight of them a reader opens to follow the run (docs/engine.md,
"Reading a run"); the script checks that each is on the road.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "multigpu"
#: the files a reader opens to follow a fit to the first training_step, in order (docs/engine.md, "Reading a run")
READING = [
    "src/cli.py",
    "multigpu/run/cli.py",
    "multigpu/facts/__init__.py",
    "multigpu/run/checks.py",
    "multigpu/run/run_lock.py",
    "multigpu/checkpoints/resume.py",
    "multigpu/run/trainer.py",
    "multigpu/data/engine_loaders.py",
]
#: each step of the run's construction, by the function that takes it: the trace shows in which file it ran
STEPS = {
    "facts": "of",
    "checks": "check_before_launch",
    "run directory": "hold_run_dir",
    "checkpoint": "resolve_checkpoint",
    "model and data": "instantiate_classes",
    "callbacks": "run_callbacks",
    "Trainer": "build_trainer",
    "training loader": "_build",
}
DEFAULT = ["--config", str(REPO / "tests" / "configs" / "tiny.yaml"), "--trainer.max_steps=1", "--progress_bar=none"]


class Road:
    """Records the engine's functions that run until a model's ``training_step`` is first called."""

    def __init__(self) -> None:
        self.functions: OrderedDict[str, set[str]] = OrderedDict()
        self.reached = False

    def __call__(self, frame, event: str, arg) -> None:  # sys.setprofile's hook
        if event != "call" or self.reached:
            return
        code = frame.f_code
        if code.co_name == "training_step":
            self.reached = True
            return
        path = Path(code.co_filename)
        if path.is_relative_to(ENGINE) and code.co_name != "<module>":
            self.functions.setdefault(str(path.relative_to(REPO)), set()).add(code.co_name)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    import tempfile

    import src.cli

    road = Road()
    with tempfile.TemporaryDirectory() as run_dir:
        args = ["fit", *(argv or DEFAULT), f"--trainer.default_root_dir={run_dir}"]
        threading.setprofile(road)
        sys.setprofile(road)
        try:
            src.cli.main(args)
        except SystemExit as stop:
            if stop.code:
                raise
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    print(f"{len(road.functions)} modules of the engine run before the first training_step:")
    for index, (module, functions) in enumerate(road.functions.items(), 1):
        print(f"{index:3d}  {module:48s} {len(functions):3d} functions")
    # src/cli.py runs at import; a package's __init__ is on the road when its table (constants) is read
    off_road = [path for path in READING if path.startswith("multigpu/") and path not in road.functions]
    off_road = [path for path in off_road if not path.endswith("__init__.py")]
    print(f"{len(READING)} files a reader opens (docs/engine.md, Reading a run); not on the road: {off_road or 'none'}")
    where = {step: [m for m, functions in road.functions.items() if name in functions] for step, name in STEPS.items()}
    outside = [step for step, modules in where.items() if not set(modules) & set(READING)]
    print(
        "the run's construction, step by step:", "; ".join(f"{step}: {', '.join(where[step]) or '-'}" for step in STEPS)
    )
    print(f"steps outside the files a reader opens: {outside or 'none'}")
    return 1 if off_road or outside else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
