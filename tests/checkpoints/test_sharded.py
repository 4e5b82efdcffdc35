"""``multigpu/checkpoints/sharded.py``: a folder of shards replaced atomically, and read only once checked (trained
runs, a kill between the two renames and the reading of a whole folder are tested in
tests/strategies/test_model_parallel.py; the check itself in test_safe.py)."""

import pytest

from multigpu.checkpoints.sharded import (
    is_sharded_checkpoint,
    load_sharded_checkpoint,
    move_into_place,
    restore_interrupted,
    staging_path,
)
from multigpu.errors import ConfigurationError
from tests.helpers import RUNS_COMMAND_GLOBAL, folder_whose_index_runs_code


def shards(folder, step: int):
    folder.mkdir(parents=True)
    for name in (".metadata", "meta.pt", "__0_0.distcp"):
        (folder / name).write_text(str(step))
    return folder


def test_a_new_folder_replaces_the_old_one_and_a_kill_between_renames_is_undone(tmp_path):
    final = shards(tmp_path / "last.ckpt", 1)
    move_into_place(shards(staging_path(final), 2), final)
    assert is_sharded_checkpoint(final) and (final / "meta.pt").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no staging or old folder left

    # a kill after the old folder was moved aside and before the new one moved in: the old one comes back
    aside = final.with_name(".last.ckpt.old")
    final.rename(aside)
    restore_interrupted(tmp_path)
    assert is_sharded_checkpoint(final) and not aside.exists()


def test_a_folder_is_read_whole_only_once_checked(tmp_path):
    folder = folder_whose_index_runs_code(tmp_path / "last.ckpt", tmp_path / "ran")
    with pytest.raises(ConfigurationError, match=f"holds {RUNS_COMMAND_GLOBAL}"):
        load_sharded_checkpoint(folder)
    assert not (tmp_path / "ran").exists()
    with pytest.raises(ConfigurationError, match="not a complete sharded checkpoint"):
        load_sharded_checkpoint(tmp_path)
