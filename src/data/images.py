"""Image classification data: CIFAR-10 from its python-pickle batches, or an embedded synthetic set of the same shape.

The synthetic set needs no download and is learnable: each of the 10 classes is a grating with its own
orientation and frequency, drawn with random phase, colours, contrast, noise and an occluding patch, so a
classifier has to learn shape rather than colour. Untrained weights score about 10%.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset

from multigpu import (
    FILE_SYSTEM_ERRNOS,
    ConfigurationError,
    EnvironmentFailure,
    GlobalBatchDataModule,
    file_system_failure,
    global_seed,
    is_network_error,
    network_failure,
    seeded_generator,
)

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
DOWNLOAD_TIMEOUT_S = 60  # seconds without a byte before a download fails (urllib's default is to wait forever)
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILES = ("test_batch",)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


class IndexedImages(Dataset):
    """uint8 images ``(N, 3, H, W)`` and labels; items are ``(image, label, index)``, the index for augmentation."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or len(images) != len(labels):
            raise ValueError(
                f"expected uint8 images (N, C, H, W) and N labels, got {tuple(images.shape)} and {len(labels)}"
            )
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor, int]:
        return self.images[index], self.labels[index], index


# -- the embedded synthetic set -------------------------------------------------------------------------------


def synthetic_images(num_samples: int, seed: int, num_classes: int = 10, size: int = 32) -> IndexedImages:
    """Generate ``num_samples`` learnable 3x``size``x``size`` images, balanced over ``num_classes`` classes."""
    g = seeded_generator(seed)
    labels = torch.arange(num_samples) % num_classes
    labels = labels[torch.randperm(num_samples, generator=g)]

    def uniform(*shape: int, low: float = 0.0, high: float = 1.0) -> Tensor:
        return low + (high - low) * torch.rand(*shape, generator=g)

    # class -> orientation (5 angles) and spatial frequency (2 values), jittered per sample
    angle = (labels % 5).float() * (math.pi / 5) + uniform(num_samples, low=-0.12, high=0.12)
    freq = 2.0 + 2.5 * (labels // 5).float() + uniform(num_samples, low=-0.4, high=0.4)
    phase = uniform(num_samples, high=2 * math.pi)

    coords = torch.linspace(-0.5, 0.5, size)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    proj = xx[None] * torch.cos(angle)[:, None, None] + yy[None] * torch.sin(angle)[:, None, None]
    wave = 0.5 + 0.5 * torch.sin(2 * math.pi * freq[:, None, None] * proj + phase[:, None, None])

    foreground = uniform(num_samples, 3, 1, 1, low=0.2, high=1.0)
    background = uniform(num_samples, 3, 1, 1, low=0.0, high=0.6)
    contrast = uniform(num_samples, 1, 1, 1, low=0.5, high=1.0)
    images = background + contrast * (foreground - background) * wave[:, None]

    # an occluding square of random colour, position and size hides part of the pattern
    side = (uniform(num_samples) * size * 0.35 + 4).long()
    top = (uniform(num_samples) * (size - side)).long()
    left = (uniform(num_samples) * (size - side)).long()
    index = torch.arange(size)
    rows = (index[None] >= top[:, None]) & (index[None] < (top + side)[:, None])
    cols = (index[None] >= left[:, None]) & (index[None] < (left + side)[:, None])
    patch = (rows[:, :, None] & cols[:, None, :])[:, None]
    images = torch.where(patch, uniform(num_samples, 3, 1, 1), images)

    images = images + 0.08 * torch.randn(images.shape, generator=g)
    images = (images.clamp(0, 1) * 255).round().to(torch.uint8)
    return IndexedImages(images, labels)


# -- CIFAR-10 in its python-pickle format ---------------------------------------------------------------------


def find_cifar10_folder(data_dir: str | Path) -> Path | None:
    """Return the folder holding the CIFAR-10 batch files under ``data_dir`` (or ``data_dir`` itself), if any."""
    root = Path(data_dir)
    for candidate in (root / CIFAR10_FOLDER, root):
        if all((candidate / name).is_file() for name in CIFAR10_TRAIN_FILES + CIFAR10_TEST_FILES):
            return candidate
    return None


def check_no_partial_cifar10(data_dir: str | Path) -> None:
    """Refuse a ``cifar-10-batches-py`` folder that lacks some batch files: an interrupted unpacking of an older
    version of this module left it, and unpacking a new archive must not mix with it."""
    folder = Path(data_dir) / CIFAR10_FOLDER
    if not folder.is_dir():
        return
    missing = [name for name in CIFAR10_TRAIN_FILES + CIFAR10_TEST_FILES if not (folder / name).is_file()]
    if missing:
        raise ConfigurationError(
            f"{folder} is incomplete (no {', '.join(missing)}): an interrupted download or unpacking left it."
            f" Fix: delete it (`rm -r {folder}`) and run again with --data.init_args.download=true, or copy an"
            " intact cifar-10-batches-py there."
        )


def read_cifar10_batches(folder: Path, files: tuple[str, ...]) -> IndexedImages:
    """Read CIFAR-10 batch files (pickled dicts with ``data`` (N, 3072) uint8 and ``labels``).

    The files are Python pickles, so only read copies you trust (the official archive is checked by MD5).
    """
    images, labels = [], []
    for name in files:
        try:
            with open(folder / name, "rb") as handle:
                batch = pickle.load(handle, encoding="bytes")
            data = batch[b"data"] if b"data" in batch else batch["data"]
            targets = batch[b"labels"] if b"labels" in batch else batch["labels"]
            images.append(torch.as_tensor(data, dtype=torch.uint8).reshape(-1, 3, 32, 32))
            labels.append(torch.as_tensor(targets, dtype=torch.long))
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, RuntimeError) as error:
            raise ConfigurationError(
                f"{folder / name} is not a readable CIFAR-10 batch file ({type(error).__name__}: {error}): it is"
                f" truncated or damaged, e.g. by an interrupted download or copy. Fix: delete it (`rm -r {folder}`)"
                " and run again with --data.init_args.download=true, or copy an intact cifar-10-batches-py there."
            ) from None
    return IndexedImages(torch.cat(images), torch.cat(labels))


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _no_download_fix(url: str, target: Path) -> str:
    return (
        f"run the same command once where there is a network (on a cluster, the login node) to download into"
        f" {target}, or download {url} there and unpack it into {target} (`tar -xzf cifar-10-python.tar.gz -C"
        f" {target}`); or leave --data.init_args.data_dir unset to train on the embedded synthetic set"
    )


def _fetch(url: str, archive: Path, md5: str) -> None:
    """Download ``url`` to ``archive``: into a temporary file in the same folder, renamed into place only once it
    is complete and its MD5 matches, so a failed or killed download leaves no file that looks like the archive."""
    handle, partial = tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.", suffix=".part")
    try:
        try:
            digest = hashlib.md5()
            with os.fdopen(handle, "wb") as file, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    file.write(chunk)
                    digest.update(chunk)
        except Exception as error:
            if is_network_error(error):
                raise network_failure(error, url, fix=_no_download_fix(url, archive.parent)) from error
            if isinstance(error, OSError) and error.errno in FILE_SYSTEM_ERRNOS:
                raise file_system_failure(error, error.filename or archive) from error
            raise
        if digest.hexdigest() != md5:
            raise EnvironmentFailure(
                f"download failed: {url} arrived damaged (MD5 {digest.hexdigest()}, expected {md5}); nothing was"
                " kept. Fix: run again; if it repeats, download it by hand and check it (`md5sum`)."
            )
        os.replace(partial, archive)  # atomic within one file system
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _unpack(archive: Path, target: Path) -> None:
    """Unpack ``archive`` into a temporary folder in ``target`` and move its batch folder into place whole."""
    staging = Path(tempfile.mkdtemp(dir=target, prefix=".unpack-"))
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12: refuse links and paths outside target
                tar.extractall(staging, filter="data")
            else:
                tar.extractall(staging)
        unpacked = find_cifar10_folder(staging)
        if unpacked is None:
            raise ConfigurationError(
                f"{archive} holds no CIFAR-10 batch files. Fix: delete it (`rm {archive}`) and run again."
            )
        if find_cifar10_folder(target) is None:  # another node sharing the folder may have finished first
            os.replace(unpacked, target / CIFAR10_FOLDER)
    except OSError as error:
        if error.errno not in FILE_SYSTEM_ERRNOS:
            raise
        raise file_system_failure(error, error.filename or target) from error
    except (tarfile.TarError, EOFError) as error:
        raise ConfigurationError(
            f"{archive} is not a readable archive ({type(error).__name__}: {error}). Fix: delete it (`rm {archive}`)"
            " and run again."
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def download_cifar10(data_dir: str | Path, url: str = CIFAR10_URL, md5: str = CIFAR10_MD5) -> Path:
    """Download and unpack the official CIFAR-10 python archive into ``data_dir``; return the batch folder. The
    archive and the folder appear only once complete, so nothing left behind can be mistaken for data."""
    target = Path(data_dir)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        if error.errno not in FILE_SYSTEM_ERRNOS:
            raise
        raise file_system_failure(error, error.filename or target) from error
    check_no_partial_cifar10(target)
    archive = target / CIFAR10_ARCHIVE
    if archive.is_file() and _md5(archive) != md5:
        raise ConfigurationError(
            f"{archive} is not the CIFAR-10 archive (MD5 {_md5(archive)}, expected {md5}): an interrupted or damaged"
            f" download. Fix: delete it (`rm {archive}`) and run again."
        )
    if not archive.is_file():
        _fetch(url, archive, md5)
    _unpack(archive, target)
    archive.unlink(missing_ok=True)  # unpacked and moved into place: the batches are all that is kept
    folder = find_cifar10_folder(target)
    assert folder is not None
    return folder


# -- augmentation that depends on (seed, epoch, sample) only --------------------------------------------------

_PRIME = 2_147_483_647  # 2**31 - 1: products of two values below it fit in int64


def _hash(values: Tensor, salt: int) -> Tensor:
    """A cheap integer hash of ``values`` (int64, below 2**31) into [0, 2**31)."""
    h = (values * 1_103_515_245 + salt * 12_345 + 1) % _PRIME
    h = (h * 48_271 + 11) % _PRIME
    return (h * 69_621 + 7) % _PRIME


def random_crop_flip(images: Tensor, indices: Tensor, seed: int, epoch: int, padding: int = 4) -> Tensor:
    """Pad-and-crop plus horizontal flip, decided per sample by a hash of (seed, epoch, index): a random generator
    would depend on which process and worker loaded the sample."""
    n, _, height, width = images.shape
    h = _hash(indices.long() % _PRIME, salt=(seed * 1_000_003 + epoch) % _PRIME)
    span = 2 * padding + 1
    dy, dx, flip = h % span, (h // span) % span, (h // (span * span)) % 2 == 1
    padded = torch.nn.functional.pad(images, (padding,) * 4)
    rows = dy[:, None] + torch.arange(height, device=images.device)[None]
    cols = dx[:, None] + torch.arange(width, device=images.device)[None]
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    batch_index = torch.arange(n, device=images.device)[:, None, None]
    cropped = padded.permute(0, 2, 3, 1)[batch_index, rows[:, :, None], cols[:, None, :]]
    return cropped.permute(0, 3, 1, 2)


class CIFAR10DataModule(GlobalBatchDataModule):
    """CIFAR-10 (or the embedded synthetic set when ``data_dir`` is not given), 32x32 RGB, 10 classes.

    ``prepare_data`` (one process per node) downloads when ``download=True``; ``setup`` (every process) reads
    the batches and splits a validation set off the training batches with a fixed seed.

    Args:
        data_dir: Folder with ``cifar-10-batches-py/`` (or the batch files themselves). Unset: synthetic data.
        download: Download the official archive into ``data_dir`` if the batches are not there.
        val_size: Training images held out for validation (CIFAR-10 only).
        synthetic_train_size: Training images of the synthetic set.
        synthetic_val_size: Validation (and test) images of the synthetic set.
        augment: Random crop and horizontal flip of training images.
        batch_size: Global batch size of one optimizer step (see ``GlobalBatchDataModule``).
        num_workers: Loader worker processes per training process.
        pin_memory: Pin host memory when training on a GPU.
    """

    num_classes = 10

    def __init__(
        self,
        data_dir: str | None = None,
        download: bool = False,
        val_size: int = 5000,
        synthetic_train_size: int = 8192,
        synthetic_val_size: int = 1024,
        augment: bool = True,
        batch_size: int = 128,
        num_workers: int = 0,
        pin_memory: bool = True,
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory)
        self.save_hyperparameters()
        self.data_dir = data_dir
        self.download = download
        self.val_size = val_size
        self.synthetic_train_size = synthetic_train_size
        self.synthetic_val_size = synthetic_val_size
        self.augment = augment
        self._normalization: dict[torch.device, tuple[Tensor, Tensor]] = {}  # mean and std, per device

    def prepare_data(self) -> None:
        for option in ("synthetic_train_size", "synthetic_val_size"):
            if self.data_dir is None and getattr(self, option) < 1:
                raise ConfigurationError(
                    f"--data.init_args.{option}={getattr(self, option)} leaves the synthetic set empty."
                    f" Fix: use at least one batch of images, e.g. --data.init_args.{option}={self.batch_size}."
                )
        if self.data_dir is None or find_cifar10_folder(self.data_dir) is not None:
            return
        check_no_partial_cifar10(self.data_dir)
        if self.download:
            download_cifar10(self.data_dir)
            return
        raise ConfigurationError(
            f"--data.init_args.data_dir={self.data_dir} holds no CIFAR-10 batches (expected {CIFAR10_FOLDER}/"
            "data_batch_1..5 and test_batch). Fix: point data_dir at the folder that contains them, add"
            " --data.init_args.download=true where a network is available, or leave data_dir unset to train on"
            " the embedded synthetic set."
        )

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.data_dir is None:
            self.prepare_data()  # the size checks, on every process
            self.train_set = synthetic_images(self.synthetic_train_size, seed=0, num_classes=self.num_classes)
            self.val_set = synthetic_images(self.synthetic_val_size, seed=1, num_classes=self.num_classes)
            self.test_set = synthetic_images(self.synthetic_val_size, seed=2, num_classes=self.num_classes)
            return
        folder = find_cifar10_folder(self.data_dir)
        if folder is None:  # prepare_data ran on another node, or not at all
            self.prepare_data()
            folder = find_cifar10_folder(self.data_dir)
            assert folder is not None
        full = read_cifar10_batches(folder, CIFAR10_TRAIN_FILES)
        if not 0 < self.val_size < len(full):
            raise ConfigurationError(
                f"--data.init_args.val_size={self.val_size} must be between 1 and {len(full) - 1}"
                f" (the training batches in {folder} hold {len(full)} images). Fix: e.g. --data.init_args.val_size="
                f"{max(1, len(full) // 10)}."
            )
        order = torch.randperm(len(full), generator=seeded_generator(0))
        val_idx, train_idx = order[: self.val_size], order[self.val_size :]
        self.train_set = IndexedImages(full.images[train_idx], full.labels[train_idx])
        self.val_set = IndexedImages(full.images[val_idx], full.labels[val_idx])
        self.test_set = read_cifar10_batches(folder, CIFAR10_TEST_FILES)

    def on_after_batch_transfer(
        self, batch: tuple[Tensor, Tensor, Tensor], dataloader_idx: int
    ) -> tuple[Tensor, Tensor]:
        """Augment (training only) and normalise on the device, where it is cheap; returns ``(images, labels)``."""
        images, labels, indices = batch
        trainer = self.trainer
        if self.augment and trainer is not None and trainer.training:
            images = random_crop_flip(images, indices, seed=global_seed(), epoch=trainer.current_epoch)
        if images.device not in self._normalization:  # copied to the device once, not on every batch
            stats = (torch.tensor(CIFAR10_MEAN), torch.tensor(CIFAR10_STD))
            self._normalization[images.device] = tuple(t.view(1, 3, 1, 1).to(images.device) for t in stats)
        mean, std = self._normalization[images.device]
        return (images.float() / 255 - mean) / std, labels
