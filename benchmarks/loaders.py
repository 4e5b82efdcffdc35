"""The engine's sampling of a user's loader against the plain loader, side by side: batches per second with loader
workers, median of repeats run in alternation (so that a busy machine slows both alike).

``python -m benchmarks.loaders [--repeats 7] [--batches 200] [--workers 2] [--image_size 40]`` from the repository
root. The dataset crops a random window of 7/8 of an image's side, flips it at random and normalises it in
``__getitem__`` (torch's global generator), as an augmentation does; the plain loader shuffles it, the engine's
loader is the same ``DataLoader`` made again with the engine's sampler and per-sample seeding
(``multigpu/data/loaders.py``), on one process. The target: the engine's loader delivers at least 98% of the plain
loader's batches per second.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset

from multigpu.data.loaders import EngineSampler, SeededSamples, World


class CroppedImages(Dataset):
    """Random crops of fixed images, flipped at random and normalised, drawn in the workers (``size``: the
    image's side; a crop is 7/8 of it)."""

    def __init__(self, count: int = 1024, size: int = 40) -> None:
        self.images = torch.rand(count, 3, size, size, generator=torch.Generator().manual_seed(0))
        self.crop = size * 7 // 8

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> torch.Tensor:
        top, left = (int(v) for v in torch.randint(0, self.images.shape[-1] - self.crop + 1, (2,)))
        image = self.images[index, :, top : top + self.crop, left : left + self.crop]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return (image - 0.5) / 0.25


def loaders(batch: int, workers: int, size: int) -> dict[str, DataLoader]:
    dataset = CroppedImages(size=size)
    common = {"num_workers": workers, "persistent_workers": workers > 0}
    sampler = EngineSampler(dataset, batch, World(1, 0, 1, seed=0), shuffle=True)
    return {
        "plain": DataLoader(dataset, batch_size=batch, shuffle=True, **common),
        "engine": DataLoader(
            SeededSamples(dataset, 0),
            batch_size=sampler.micro_batch_size,
            sampler=sampler,
            generator=torch.Generator(),
            **common,
        ),
    }


def batches_per_second(loader: DataLoader, count: int) -> float:
    iterator = iter(loader)
    next(iterator)  # the workers started
    start = time.perf_counter()
    for _ in range(count):
        try:
            next(iterator)
        except StopIteration:
            iterator = iter(loader)
            next(iterator)
    return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image_size", type=int, default=40, help="the side of the images, in pixels")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    built = loaders(options.batch_size, options.workers, options.image_size)
    rates: dict[str, list[float]] = {name: [] for name in built}
    for repeat in range(options.repeats):
        order = list(built) if repeat % 2 == 0 else list(reversed(built))  # neither always runs first
        for name in order:
            rates[name].append(batches_per_second(built[name], options.batches))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        spread = f"{min(values):.1f} to {max(values):.1f}"
        print(f"{name:>6}  {medians[name]:8.1f} batches/s  (median of {len(values)}, {spread})")
    print(f"engine / plain: {medians['engine'] / medians['plain']:.3f}")


if __name__ == "__main__":
    main()
