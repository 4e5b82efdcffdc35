"""What the engine's handling of a training loader costs in samples per second: the loader the engine hands
Lightning beside the same loader as the data module returns it, read for a whole epoch, interleaved.

    python scripts/loader_overhead.py --samples 4096 --batch-size 32 --repeats 7

For each loader (a shuffled ``DataLoader`` over a map-style dataset, and LitData's ``StreamingDataLoader`` over
chunks this script writes with ``litdata.optimize``; the latter is left out where LitData is not installed) a
one-device ``Trainer`` with the engine's ``EngineLoaders`` callback fits one step, and the loader it trained from
is kept: for the plain loader the engine's rebuild (its sampler, each sample loaded with seeded generators), for
LitData's the user's own object, which the engine keeps as it is. Each repeat then reads one epoch of the bare
loader and one of the engine's, in alternating order, and counts samples per second. Reading the loader alone,
with no model step, is the strictest measure: in training the step's time is added to both and the ratio is
nearer 1; ``--train-width W`` adds that step (an MLP of width ``W``, SGD) to every batch, the throughput of a
small training loop. Prints, per loader, the median and the spread (min-max) over the repeats and the ratio of the
medians (engine / bare).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402
from lightning.pytorch.utilities import CombinedLoader  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from multigpu.data.engine_loaders import EngineLoaders  # noqa: E402


def sample(index: int, features: int) -> dict[str, Any]:
    """Sample ``index``: its id and ``features`` values drawn from a generator seeded by it (a decode's work)."""
    return {"id": index, "x": torch.randn(features, generator=torch.Generator().manual_seed(index))}


class Samples(Dataset):
    def __init__(self, size: int, features: int) -> None:
        self.size, self.features = size, features

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        return sample(index, self.features)


class Loaders(L.LightningDataModule):
    def __init__(self, make: Callable[[], DataLoader]) -> None:
        super().__init__()
        self.make = make
        self.made: list[DataLoader] = []

    def train_dataloader(self) -> DataLoader:
        self.made.append(self.make())
        return self.made[-1]


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.LazyLinear(1)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self.net(batch["x"]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Keep(Callback):
    """Keeps the training loader the Trainer reads."""

    loader: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.loader = CombinedLoader(trainer.train_dataloader).flattened[0]


def through_the_engine(make: Callable[[], DataLoader]) -> tuple[DataLoader, bool]:
    """The loader the engine hands Lightning for ``make()``'s, after one training step, and whether it is the
    data module's own."""
    keep, data = Keep(), Loaders(make)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=1, callbacks=[EngineLoaders(), keep], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(), datamodule=data)
    return keep.loader, any(keep.loader is made for made in data.made)


def cpu_seconds() -> float:
    """CPU time of this process and of its loader workers that have ended (torch joins them at an epoch's end)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def epoch_rate(loader: DataLoader, step: Callable[[torch.Tensor], None] | None) -> float:
    """Samples per CPU-second of one epoch of ``loader`` (with ``step`` on each batch)."""
    start, count = cpu_seconds(), 0
    for batch in loader:
        if step is not None:
            step(batch["x"])
        count += len(batch["id"])
    return count / (cpu_seconds() - start)


def training_step(features: int, width: int) -> Callable[[torch.Tensor], None] | None:
    """One SGD step of an MLP of ``width`` on a batch (None for ``width`` 0: the loader alone)."""
    if not width:
        return None
    model = torch.nn.Sequential(torch.nn.Linear(features, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(x: torch.Tensor) -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def write_chunks(output_dir: str, size: int, features: int) -> None:
    """``size`` samples written into LitData chunks, in a process of its own (the writer changes its environment)."""
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from scripts.loader_overhead import optimize_into; "
    code += f"optimize_into({output_dir!r}, {size}, {features})"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def optimize_into(output_dir: str, size: int, features: int) -> None:
    from litdata import optimize

    optimize(fn=partial(sample, features=features), inputs=list(range(size)), output_dir=output_dir,
             chunk_bytes="1MB", num_workers=1)  # fmt: skip


def loaders(args: argparse.Namespace, work: Path) -> dict[str, Callable[[], DataLoader]]:
    """How each measured loader is made, by its label."""
    made = {
        "DataLoader, map-style, shuffled": lambda: DataLoader(
            Samples(args.samples, args.features), batch_size=args.batch_size, shuffle=True, num_workers=args.workers
        )
    }
    if find_spec("litdata") is None:
        print("LitData is not installed: its loader is left out (pip install --no-deps litdata)")
        return made
    chunks = str(work / "chunks")
    write_chunks(chunks, args.samples, args.features)

    def streaming() -> DataLoader:
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(chunks, shuffle=True, drop_last=True)
        return StreamingDataLoader(dataset, batch_size=args.batch_size, num_workers=max(args.workers, 1))

    made["LitData StreamingDataLoader"] = streaming
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096, help="samples of one epoch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--features", type=int, default=32, help="values of one sample (3072: a 32x32 RGB image)")
    parser.add_argument("--workers", type=int, default=0, help="the plain loader's workers (LitData's: at least 1)")
    parser.add_argument("--repeats", type=int, default=7, help="epochs of each, interleaved")
    parser.add_argument("--train-width", type=int, default=0, help="an MLP step per batch of this width (0: none)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("PL_GLOBAL_SEED", "0")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="loader_overhead_") as work:
        rates, hows = measure(args, Path(work))
    print_table(args, rates, hows, load_before)


def measure(args: argparse.Namespace, work: Path) -> tuple[dict[str, dict[str, list[float]]], dict[str, str]]:
    """Samples per second of each loader's epochs, bare and through the engine, and how the engine handled it."""
    rates: dict[str, dict[str, list[float]]] = {}
    hows: dict[str, str] = {}
    for label, make in loaders(args, work).items():
        engine, kept = through_the_engine(make)
        pair = {"bare": make(), "engine": engine}
        rates[label] = {"bare": [], "engine": []}
        step = training_step(args.features, args.train_width)
        for repeat in range(args.repeats):
            for variant in ("bare", "engine") if repeat % 2 == 0 else ("engine", "bare"):
                rates[label][variant].append(epoch_rate(pair[variant], step))
        hows[label] = "kept as it is" if kept else "rebuilt by the engine"
    return rates, hows


def print_table(
    args: argparse.Namespace, rates: dict[str, dict[str, list[float]]], hows: dict[str, str], load_before: float
) -> None:
    training = f", an MLP step of width {args.train_width} per batch" if args.train_width else ", the loader alone"
    print(f"\n{args.samples} samples of {args.features} values, batch {args.batch_size}{training}, {args.repeats}"
          f" interleaved epochs each; load average {load_before:.2f} before,"
          f" {os.getloadavg()[0]:.2f} after")  # fmt: skip
    print(f"  {'loader':32s} {'engine':22s} {'bare, samples/CPU-s':>19s} {'engine, samples/CPU-s':>21s}"
          f" {'engine/bare':>11s} {'CPU-us added per sample':>23s}")  # fmt: skip
    for label, measured in rates.items():
        bare, engine = statistics.median(measured["bare"]), statistics.median(measured["engine"])
        spread = {name: f"{min(v):,.0f}-{max(v):,.0f}" for name, v in measured.items()}
        print(f"  {label:32s} {hows[label]:22s} {bare:19,.0f} {engine:21,.0f} {engine / bare:11.3f}"
              f" {1e6 / engine - 1e6 / bare:23.2f}")  # fmt: skip
        print(f"  {'':32s} {'spread (min-max)':22s} {spread['bare']:>19s} {spread['engine']:>21s}")


if __name__ == "__main__":
    main()
