"""Host-device synchronisations per training step of a real ``python -m src.cli fit`` run, after warm-up.

    python scripts/sync_count.py --strategy dp --out sync/dp.json
    python scripts/sync_count.py --strategy ddp --workload gpt --warmup 10 --steps 30 --out sync/ddp.json

Builds the run as ``python -m src.cli fit`` does (``CLI(run=False)``: ``configs/default.yaml``, the default
callbacks, the CSV logger, the progress bar), on one device under ``--strategy`` (``single``, ``dp`` or ``ddp``),
and trains ``--warmup`` + ``--steps`` optimizer steps without validation. From the first counted step on,
``torch.cuda.set_sync_debug_mode("warn")`` makes PyTorch warn at every synchronising CUDA call, and each warning is
counted for the step it falls in: from one ``on_train_batch_start`` to the next, so the data fetch, the step,
every callback, the logger and the progress bar are all in it. The warnings come from every thread (``dp`` runs its
replicas in threads), and each is filed under where it was called from (the innermost frames of its stack).

Without CUDA (a CPU), a stand-in counts instead, for testing this script only: the calls that synchronise when
their tensor is on a GPU (``Tensor.item``, ``tolist``, ``__bool__``, ``__float__``, ``__int__``) warn as the
CUDA mode does. Its counts are not GPU figures (on a CPU those calls cost nothing, and torch's CPU code makes
some that its CUDA code does not); the JSON says which mode counted.

Writes ``--out`` (JSON: the mode, the count of each counted step, the median, the total and the call sites) and
prints one line. Extra arguments after ``--`` go to ``python -m src.cli fit`` (later ones win).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

#: the text of the warning of ``torch.cuda.set_sync_debug_mode("warn")`` (c10/cuda/CUDAFunctions.cpp)
SYNC_WARNING = "called a synchronizing CUDA operation"
#: the tensor methods the CPU stand-in counts: each blocks the host until the device is done when on a GPU
STAND_IN_CALLS = ("item", "tolist", "__bool__", "__float__", "__int__")
#: ``--strategy`` -> the fit flags that select it, on one device
STRATEGIES = {"single": [], "dp": ["--trainer.strategy=dp"], "ddp": ["--trainer.strategy=ddp"]}


def call_site(stack: list[traceback.FrameSummary], depth: int = 4) -> str:
    """The innermost ``depth`` frames outside this script and Python's warnings and threads: the synchronising
    call and its callers (innermost first)."""
    own = ("/warnings.py", "sync_count.py", "/threading.py")
    frames = [frame for frame in stack if not any(part in frame.filename for part in own)]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-depth:]))


class SyncCounter(Callback):
    """Counts the synchronisation warnings per optimizer step, from step ``warmup`` for ``steps`` steps.

    ``switch(on)`` turns the warnings on and off: ``torch.cuda.set_sync_debug_mode`` on a GPU, the stand-in on a
    CPU. Python's ``warnings.showwarning`` is global, so warnings from the replica threads of ``dp`` and from
    autograd's backward are counted too; other warnings are passed on as before.
    """

    def __init__(self, warmup: int, steps: int, switch: Callable[[bool], None]) -> None:
        self.warmup, self.steps, self.switch = warmup, steps, switch
        self.per_step: list[int] = []
        self.sites: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._saved: Any = None

    @property
    def counting(self) -> bool:
        return self._saved is not None

    def _record(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None):
        if SYNC_WARNING not in str(message):
            return self._saved[1](message, category, filename, lineno, file, line)
        site = call_site(traceback.extract_stack()[:-1])
        with self._lock:
            self.per_step[-1] += 1
            self.sites[site] += 1
        return None

    def start(self) -> None:
        self._saved = (warnings.filters[:], warnings.showwarning)
        warnings.filterwarnings("always", message=SYNC_WARNING)  # every call, not once per call site
        warnings.showwarning = self._record
        self.per_step.append(0)
        self.switch(True)

    def stop(self) -> None:
        if self.counting:
            self.switch(False)
            warnings.filters[:], warnings.showwarning = self._saved
            self._saved = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        step = trainer.global_step - self.warmup
        if step == 0 and not self.counting and not self.per_step:
            self.start()
        elif self.counting and step >= len(self.per_step):  # a new optimizer step begins
            if step >= self.steps:
                self.stop()
            else:
                self.per_step.append(0)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        return {
            "steps": len(self.per_step),
            "per_step": self.per_step,
            "median": statistics.median(self.per_step) if self.per_step else None,
            "max": max(self.per_step, default=None),
            "total": sum(self.per_step),
            "sites": [{"site": site, "count": count} for site, count in self.sites.most_common()],
        }


def cuda_switch(on: bool) -> None:
    torch.cuda.set_sync_debug_mode("warn" if on else "default")


@contextmanager
def stand_in() -> Iterator[Callable[[bool], None]]:
    """The CPU stand-in: while switched on, each of ``STAND_IN_CALLS`` warns as a synchronising CUDA call does."""
    state = {"on": False}
    originals = {name: getattr(torch.Tensor, name) for name in STAND_IN_CALLS}

    def warning(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if state["on"]:
                warnings.warn(SYNC_WARNING, UserWarning, stacklevel=2)
            return original(self, *args, **kwargs)

        return call

    for name, original in originals.items():
        setattr(torch.Tensor, name, warning(original))
    try:
        yield lambda on: state.update(on=on)
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def fit_flags(args: argparse.Namespace, run_dir: str) -> list[str]:
    """The ``python -m src.cli fit`` arguments of the counted run: the workload, one device, no validation."""
    from benchmarks.workloads import WORKLOADS, cli_flags

    extra = {"data.init_args.batch_size": args.batch_size} if args.batch_size else {}
    return [
        *cli_flags(WORKLOADS[args.workload], args.quick, extra),
        *STRATEGIES[args.strategy],
        "--trainer.devices=1",
        f"--trainer.max_steps={args.warmup + args.steps + 1}",  # the step after the last counted one ends it
        "--trainer.max_epochs=-1",
        "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0",
        f"--trainer.default_root_dir={run_dir}",
        *args.fit,
    ]


def count(args: argparse.Namespace) -> dict[str, Any]:
    """Train the run and count; the summary, with what counted and on which machine."""
    from src.cli import CLI

    mode = "cuda" if torch.cuda.is_available() else "cpu-stand-in"
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="sync_count_")
    with stand_in() as cpu_switch:
        cli = CLI(args=fit_flags(args, run_dir), run=False)
        counter = SyncCounter(args.warmup, args.steps, cuda_switch if mode == "cuda" else cpu_switch)
        cli.trainer.callbacks.append(counter)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    device = torch.cuda.get_device_name(0) if mode == "cuda" else "cpu"
    return {
        "strategy": args.strategy,
        "workload": args.workload,
        "mode": mode,
        "device": device,
        "torch": torch.__version__,
        "lightning": L.__version__,
        "warmup": args.warmup,
        "callbacks": [type(callback).__name__ for callback in cli.trainer.callbacks if callback is not counter],
        **counter.summary(),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="single")
    parser.add_argument("--workload", default="image", help="a workload of python -m benchmarks (image, gpt)")
    parser.add_argument("--quick", action="store_true", help="the workload's small --quick variant")
    parser.add_argument("--batch-size", type=int, help="the data module's batch_size (default: the workload's)")
    parser.add_argument("--warmup", type=int, default=10, help="optimizer steps before counting")
    parser.add_argument("--steps", type=int, default=20, help="counted optimizer steps")
    parser.add_argument("--run-dir", help="the run directory (default: a new temporary folder)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    own, _, fit = (argv[: argv.index("--")], None, argv[argv.index("--") + 1 :]) if "--" in argv else (argv, 0, [])
    args = parser.parse_args(own)
    args.fit = fit
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    result = count(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    top = result["sites"][0]["site"] if result["sites"] else "none"
    print(
        f"syncs per step, {args.strategy}, {args.workload}, {result['mode']} on {result['device']}: median"
        f" {result['median']}, max {result['max']}, total {result['total']} over {result['steps']} steps"
        f" (most: {top})"
    )


if __name__ == "__main__":
    main()
