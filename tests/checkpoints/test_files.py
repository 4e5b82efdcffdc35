"""``multigpu/checkpoints/files.py``: atomic single-file checkpoints and the one definition of intact (the kill during a
real run's write is tested in tests/faults/test_preemption.py)."""

import pickle

import pytest
import torch

from multigpu.checkpoints.files import (
    AtomicCheckpointIO,
    atomic_torch_save,
    is_intact,
    link_checkpoint,
    newest_intact_checkpoint,
    with_atomic_io,
)
from multigpu.errors import ConfigurationError
from tests.helpers import RUNS_COMMAND_GLOBAL, RunsCommand, folder_whose_index_runs_code


def test_atomic_save_replaces_the_file_only_when_complete(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("fails mid-write")

    with pytest.raises(RuntimeError, match="mid-write"):
        atomic_torch_save({"step": 2, "tensor": torch.zeros(1000), "bad": Unpicklable()}, path)
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left behind


def test_intact_means_a_complete_archive_or_a_complete_folder_of_shards(tmp_path):
    whole = tmp_path / "whole.ckpt"
    atomic_torch_save({"state_dict": {"w": torch.ones(1000)}}, whole)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])  # as a kill during a plain copy leaves it
    other = tmp_path / "other.ckpt"
    other.write_bytes(b"not a checkpoint")
    folder = tmp_path / "sharded.ckpt"
    folder.mkdir()
    assert is_intact(whole) and not is_intact(cut) and not is_intact(other)
    assert not is_intact(folder)  # no index and meta.pt: a save was cut off
    (folder / ".metadata").write_bytes(b"")
    (folder / "meta.pt").write_bytes(b"")
    assert is_intact(folder)
    assert newest_intact_checkpoint(tmp_path, skip=folder) == whole


def test_atomic_io_is_added_unless_the_user_chose_a_checkpoint_io():
    assert [type(p) for p in with_atomic_io(None)] == [AtomicCheckpointIO]
    own = AtomicCheckpointIO()
    assert with_atomic_io([own]) == [own]


def test_atomic_io_reads_a_file_weights_only_and_a_folder_checked(tmp_path):
    """What Lightning reads through the plugin (a resume, an evaluation's --ckpt_path, the tuner's own file) runs no
    code: a file with weights_only unless the caller says otherwise, a folder of shards checked whole first."""
    marker, io = tmp_path / "ran", AtomicCheckpointIO()
    atomic_torch_save({"state_dict": {}, "extra": RunsCommand(marker)}, tmp_path / "given.ckpt")
    with pytest.raises(pickle.UnpicklingError, match=RUNS_COMMAND_GLOBAL):
        io.load_checkpoint(tmp_path / "given.ckpt")
    folder = folder_whose_index_runs_code(tmp_path / "last.ckpt", marker)
    with pytest.raises(ConfigurationError, match=f"holds {RUNS_COMMAND_GLOBAL}"):
        io.load_checkpoint(folder)
    assert not marker.exists()
    atomic_torch_save({"global_step": 3}, tmp_path / "plain.ckpt")
    assert io.load_checkpoint(tmp_path / "plain.ckpt") == {"global_step": 3}


def test_a_second_name_of_a_checkpoint_is_the_same_bytes_and_survives_the_first_names_removal(tmp_path):
    """``best-<step>.ckpt`` and ``last.ckpt`` of one save: a hard link replacing the old ``last.ckpt`` (a file or a
    folder of shards, which becomes a folder of links); a later save of either name replaces it, leaving the other."""
    atomic_torch_save({"global_step": 2}, tmp_path / "last.ckpt")
    atomic_torch_save({"global_step": 4}, tmp_path / "best-4.ckpt")
    link_checkpoint(tmp_path / "best-4.ckpt", tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt").stat().st_ino == (tmp_path / "best-4.ckpt").stat().st_ino
    atomic_torch_save({"global_step": 6}, tmp_path / "last.ckpt")  # the next save: a new file under the name
    assert torch.load(tmp_path / "best-4.ckpt", weights_only=True) == {"global_step": 4}
    (tmp_path / "best-4.ckpt").unlink()
    assert torch.load(tmp_path / "last.ckpt", weights_only=True) == {"global_step": 6}
    shards = tmp_path / "best-8.ckpt"
    shards.mkdir()
    for name in (".metadata", "__0_0.distcp", "meta.pt"):
        (shards / name).write_bytes(name.encode())
    link_checkpoint(shards, tmp_path / "last.ckpt")  # a file replaced by a folder, as a resharded run may
    last = tmp_path / "last.ckpt"
    assert is_intact(last) and sorted(p.name for p in last.iterdir()) == sorted(p.name for p in shards.iterdir())
    assert all((last / p.name).stat().st_ino == p.stat().st_ino for p in shards.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-8.ckpt", "last.ckpt"]  # no staging folder left
