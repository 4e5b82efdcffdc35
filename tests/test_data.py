"""Data modules: CIFAR-10 files, the synthetic set, augmentation, text, and resumable loaders."""

import hashlib
import tarfile

import pytest
import torch

from src.data import CIFAR10DataModule, TextDataModule
from src.data.images import (
    CIFAR10_FOLDER,
    download_cifar10,
    find_cifar10_folder,
    random_crop_flip,
    synthetic_images,
)
from src.data.text import TokenWindows, decode, encode
from src.errors import ConfigurationError
from tests.conftest import write_cifar10


def test_synthetic_images_are_deterministic_balanced_cifar_shaped():
    a, b = synthetic_images(200, seed=3), synthetic_images(200, seed=3)
    assert a.images.shape == (200, 3, 32, 32) and a.images.dtype == torch.uint8
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert torch.bincount(a.labels, minlength=10).tolist() == [20] * 10
    assert not torch.equal(a.images, synthetic_images(200, seed=4).images)


def test_augmentation_depends_only_on_seed_epoch_and_sample_index():
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    index = torch.arange(100, 116)
    out = random_crop_flip(images, index, seed=1, epoch=0)
    assert out.shape == images.shape
    # the same sample gets the same crop whatever batch (process, worker) it arrives in
    assert torch.equal(random_crop_flip(images[5:9], index[5:9], seed=1, epoch=0), out[5:9])
    assert not torch.equal(random_crop_flip(images, index, seed=1, epoch=1), out)
    # every output is a crop of the zero-padded image, mirrored or not
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    for i in range(16):
        crops = [
            view[:, dy : dy + 32, dx : dx + 32]
            for view in (padded[i], padded[i].flip(-1))
            for dy in range(9)
            for dx in range(9)
        ]
        assert any(torch.equal(crop, out[i]) for crop in crops)
    assert (out != images).flatten(1).any(1).float().mean() > 0.5  # most samples are actually changed


def test_cifar10_batches_are_read_and_split(tmp_path):
    write_cifar10(tmp_path)
    dm = CIFAR10DataModule(data_dir=str(tmp_path), val_size=30, batch_size=10)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) == 70 and len(dm.val_set) == 30 and len(dm.test_set) == 20
    image, label, _ = dm.train_set[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8 and 0 <= int(label) < 10
    # the folder may also be given as the batch folder itself
    assert find_cifar10_folder(tmp_path / CIFAR10_FOLDER) == tmp_path / CIFAR10_FOLDER


def test_missing_cifar10_folder_names_the_option_and_the_fixes(tmp_path):
    dm = CIFAR10DataModule(data_dir=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigurationError, match=r"--data.init_args.data_dir=.*nowhere.*download=true.*synthetic"):
        dm.prepare_data()


def test_download_checks_the_archive_and_unpacks_it(tmp_path):
    source = tmp_path / "source"
    write_cifar10(source)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / CIFAR10_FOLDER, arcname=CIFAR10_FOLDER)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    folder = download_cifar10(tmp_path / "data", url=archive.as_uri(), md5=md5)
    assert folder == tmp_path / "data" / CIFAR10_FOLDER
    with pytest.raises(ConfigurationError, match="MD5"):
        download_cifar10(tmp_path / "bad", url=archive.as_uri(), md5="0" * 32)


def test_text_round_trips_through_byte_tokens():
    text = "héllo, wörld ✓"
    assert decode(encode(text)) == text
    assert int(encode(text).max()) < 256


def test_token_windows_shift_targets_by_one():
    windows = TokenWindows(torch.arange(50, dtype=torch.uint8), block_size=8)
    assert len(windows) == 6
    x, y = windows[1]
    assert x.tolist() == list(range(8, 16)) and y.tolist() == list(range(9, 17))


def test_text_module_reads_a_file_and_holds_out_its_end(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("abcdefghij" * 500)
    dm = TextDataModule(path=str(path), block_size=16, val_fraction=0.2, batch_size=4)
    dm.prepare_data()
    dm.setup()
    assert len(dm.train_set) == (4000 - 1) // 16
    assert len(dm.val_set) + len(dm.test_set) > 0
    with pytest.raises(ConfigurationError, match=r"--data.init_args.path=.*missing.txt is not a file"):
        TextDataModule(path=str(tmp_path / "missing.txt")).prepare_data()


def test_train_loader_outside_a_trainer_uses_the_whole_global_batch():
    dm = CIFAR10DataModule(synthetic_train_size=256, synthetic_val_size=64, batch_size=32)
    dm.setup()
    loader = dm.train_dataloader()
    images, _, _ = next(iter(loader))
    assert images.shape[0] == 32 and len(loader) == 8
    assert loader.state_dict() == {}  # no trainer: nothing to resume
