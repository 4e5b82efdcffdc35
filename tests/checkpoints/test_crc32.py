"""``multigpu/checkpoints/crc32.py``: the engine's checkpoints carry no CRC-32s, a user's ``torch.save`` keeps them."""

import zipfile

import torch

from multigpu.checkpoints.crc32 import without_crc32
from multigpu.checkpoints.files import atomic_torch_save
from multigpu.checkpoints.sharded import write_shards


def crcs(path):
    with zipfile.ZipFile(path) as archive:
        return {info.filename.rsplit("/", 1)[-1]: info.CRC for info in archive.infolist()}


def test_a_checkpoint_is_written_without_crc32s_and_a_users_torch_save_keeps_them(tmp_path):
    weights = {"w": torch.arange(1000.0)}
    atomic_torch_save(weights, tmp_path / "last.ckpt")
    assert set(crcs(tmp_path / "last.ckpt").values()) == {0}  # none computed ...
    assert torch.equal(torch.load(tmp_path / "last.ckpt", weights_only=True)["w"], weights["w"])  # ... none needed
    torch.save(weights, tmp_path / "users.pt")
    assert crcs(tmp_path / "users.pt")["0"] != 0  # torch's setting is back after the write
    with without_crc32():
        with without_crc32():  # a second write under way (the writer thread's, beside a synchronous one)
            pass
        torch.save(weights, tmp_path / "during.pt")
        assert crcs(tmp_path / "during.pt")["0"] == 0  # still off while the first is under way
    torch.save(weights, tmp_path / "after.pt")
    assert crcs(tmp_path / "after.pt")["0"] != 0


def test_the_shards_of_a_sharded_checkpoint_are_written_without_crc32s(tmp_path):
    write_shards({"state_dict": {"w": torch.arange(1000.0)}}, tmp_path / "folder", tmp_path / "folder")
    shards = [p for p in (tmp_path / "folder").iterdir() if p.suffix == ".distcp"]
    assert shards and all(zipfile.is_zipfile(p) for p in shards)  # torch.save archives ...
    assert all(set(crcs(p).values()) == {0} for p in shards)  # ... without CRC-32s
    torch.save({"w": torch.ones(3)}, tmp_path / "users.pt")
    assert crcs(tmp_path / "users.pt")["0"] != 0
