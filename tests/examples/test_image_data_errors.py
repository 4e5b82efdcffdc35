"""The CIFAR-10 data module's download: a failure is named for what it is and leaves nothing behind.

Downloads go to a ``file://`` URL (urllib reads it like any other), so these tests run without a network; the
one that needs the real download to fail is skipped where www.cs.toronto.edu resolves.
"""

from __future__ import annotations

import hashlib
import socket
import tarfile
from pathlib import Path

import pytest

from multigpu.errors import ConfigurationError, EnvironmentFailure
from src.cli import main
from src.data.images import (
    CIFAR10_ARCHIVE,
    CIFAR10_FOLDER,
    CIFAR10_URL,
    CIFAR10DataModule,
    download_cifar10,
    find_cifar10_folder,
)
from tests.conftest import REPO
from tests.examples.conftest import write_cifar10

IMAGE = ["--config", str(REPO / "configs" / "experiment" / "image.yaml"), "--trainer.accelerator=cpu"]


def network_available() -> bool:
    try:
        socket.getaddrinfo("www.cs.toronto.edu", 443)
    except OSError:
        return False
    return True


def run(capsys, tmp_path: Path, data_dir: Path, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    args = ["fit", *IMAGE, f"--data.init_args.data_dir={data_dir}", f"--trainer.default_root_dir={tmp_path / 'run'}"]
    with pytest.raises(SystemExit) as stop:
        main([*args, *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return stop.value.code, err[err.index("error: ") :]


def fake_archive(tmp_path: Path) -> tuple[Path, str]:
    """A tar.gz laid out like the official one (small random batches), and its MD5."""
    source = tmp_path / "source"
    write_cifar10(source, per_file=4)
    archive = tmp_path / "served" / CIFAR10_ARCHIVE
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / CIFAR10_FOLDER, arcname=CIFAR10_FOLDER)
    return archive, hashlib.md5(archive.read_bytes()).hexdigest()


@pytest.mark.skipif(network_available(), reason="needs a download that fails: www.cs.toronto.edu resolves here")
def test_no_network_is_named_with_the_host_and_a_second_run_fails_the_same_way(tmp_path, capsys):
    data_dir = tmp_path / "cifar10"
    messages = []
    for _ in range(2):  # the first run must leave nothing that changes what the second one says
        code, err = run(capsys, tmp_path, data_dir)
        assert code == 1, err
        assert err.startswith("error: no network: cannot reach www.cs.toronto.edu"), err
        assert CIFAR10_URL in err and f"unpack it into {data_dir}" in err and "correct those" not in err, err
        assert list(data_dir.iterdir()) == []  # no archive, no partial file
        messages.append(err)
    assert messages[0] == messages[1]


def test_a_download_is_verified_and_unpacked_whole_leaving_only_the_batches(tmp_path):
    archive, md5 = fake_archive(tmp_path)
    data_dir = tmp_path / "cifar10"
    folder = download_cifar10(data_dir, url=archive.as_uri(), md5=md5)
    assert folder == data_dir / CIFAR10_FOLDER == find_cifar10_folder(data_dir)
    assert sorted(p.name for p in data_dir.iterdir()) == [CIFAR10_FOLDER]  # no archive, no staging folder
    module = CIFAR10DataModule(data_dir=str(data_dir), val_size=4, batch_size=4)
    module.setup("fit")
    assert len(module.train_set) == 16 and len(module.val_set) == 4 and len(module.test_set) == 4


def test_a_damaged_download_keeps_nothing(tmp_path):
    archive, _ = fake_archive(tmp_path)
    data_dir = tmp_path / "cifar10"
    with pytest.raises(EnvironmentFailure, match=r"arrived damaged .*nothing was kept"):
        download_cifar10(data_dir, url=archive.as_uri(), md5="0" * 32)
    assert list(data_dir.iterdir()) == []


def test_a_damaged_archive_left_in_the_folder_is_named_with_the_fix_delete_it(tmp_path, capsys):
    data_dir = tmp_path / "cifar10"
    data_dir.mkdir()
    (data_dir / CIFAR10_ARCHIVE).write_bytes(b"\x1f\x8b half a download")
    code, err = run(capsys, tmp_path, data_dir)
    assert code == 2, err
    assert f"{data_dir / CIFAR10_ARCHIVE} is not the CIFAR-10 archive" in err and "delete it" in err, err
    assert (data_dir / CIFAR10_ARCHIVE).is_file()  # the user's file is left as it is


def test_an_incomplete_batch_folder_is_named_with_the_fix_delete_it(tmp_path, capsys):
    data_dir = tmp_path / "cifar10"
    folder = write_cifar10(data_dir, per_file=4)
    (folder / "data_batch_3").unlink()
    code, err = run(capsys, tmp_path, data_dir)
    assert code == 2, err
    assert f"{folder} is incomplete (no data_batch_3)" in err and f"rm -r {folder}" in err, err


def test_a_truncated_batch_file_is_named_with_the_fix_delete_it(tmp_path, capsys):
    data_dir = tmp_path / "cifar10"
    folder = write_cifar10(data_dir, per_file=4)
    batch = folder / "data_batch_2"
    batch.write_bytes(batch.read_bytes()[:100])
    code, err = run(capsys, tmp_path, data_dir, "--data.init_args.val_size=4")
    assert code == 2, err
    assert f"{batch} is not a readable CIFAR-10 batch file" in err and "truncated" in err, err
    assert f"delete it (`rm -r {folder}`)" in err, err


def test_an_unreachable_host_leaves_no_partial_file(tmp_path):
    data_dir = tmp_path / "cifar10"
    with pytest.raises(EnvironmentFailure, match=r"no network: cannot reach data\.invalid"):
        download_cifar10(data_dir, url="http://data.invalid/cifar-10-python.tar.gz", md5="0" * 32)
    assert list(data_dir.iterdir()) == []
    assert issubclass(EnvironmentFailure, ConfigurationError)
