"""``multigpu/checkpoints/resume.py``: which checkpoint ``--ckpt_path`` names, read once; refusals leave everything."""

import pytest
import torch
from jsonargparse import Namespace

from multigpu.checkpoints.files import atomic_torch_save
from multigpu.checkpoints.resume import checkpoint_dir, resolve_checkpoint
from multigpu.errors import ConfigurationError
from multigpu.facts import RunFacts
from tests.conftest import TINY_RUN
from tests.errors.test_errors import fails_cleanly


def config(run_dir, ckpt_path=None) -> Namespace:
    return Namespace(ckpt_path=ckpt_path, trainer=Namespace(default_root_dir=str(run_dir)))


def resolve(subcommand: str, options: Namespace) -> tuple | None:
    return resolve_checkpoint(RunFacts.of(options, subcommand), options)


def test_last_resolves_to_the_newest_intact_file_and_a_fresh_fit_is_refused(tmp_path, capsys):
    folder = tmp_path / "checkpoints"
    assert checkpoint_dir(str(tmp_path)) == str(folder)
    assert resolve("fit", config(tmp_path)) is None  # nothing there yet: a fresh run
    assert resolve("fit", config(tmp_path, "last")) is None  # Lightning says there is nothing to resume
    atomic_torch_save({"global_step": 4}, folder / "best-4.ckpt")
    atomic_torch_save({"global_step": 8}, folder / "last.ckpt")
    with pytest.raises(ConfigurationError, match="already holds a run"):
        resolve("fit", config(tmp_path))
    path, checkpoint = resolve("fit", config(tmp_path, "last"))
    assert path == folder / "last.ckpt" and checkpoint["global_step"] == 8

    data = (folder / "last.ckpt").read_bytes()
    (folder / "last.ckpt").write_bytes(data[: len(data) // 2])
    resumed = config(tmp_path, "last")
    path, checkpoint = resolve("fit", resumed)
    assert path == folder / "best-4.ckpt" and checkpoint["global_step"] == 4
    assert resumed.ckpt_path == str(folder / "best-4.ckpt")  # Lightning resumes the file the checks read
    assert "is damaged" in capsys.readouterr().err
    assert (folder / "last.ckpt").read_bytes() == data[: len(data) // 2]  # the damaged file is left as it is


def test_a_missing_file_is_refused_and_special_values_are_lightnings(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        resolve("validate", config(tmp_path, str(tmp_path / "no.ckpt")))
    assert resolve("validate", config(tmp_path, "best")) is None
    torch.save({"global_step": 1}, tmp_path / "given.ckpt")
    path, checkpoint = resolve("validate", config(tmp_path, str(tmp_path / "given.ckpt")))
    assert path == tmp_path / "given.ckpt"
    assert checkpoint["global_step"] == 1


# -- through the command line: one paragraph, exit status 2, the run directory untouched -------------------------


def test_fresh_fit_into_a_used_run_directory(capsys, untouched):
    fails_cleanly(capsys, ["fit", *TINY_RUN, f"--trainer.default_root_dir={untouched}"], "already holds a run")


def test_missing_and_corrupt_checkpoints(tmp_path, capsys, untouched):
    fails_cleanly(
        capsys,
        ["validate", *TINY_RUN, f"--trainer.default_root_dir={tmp_path}", f"--ckpt_path={tmp_path / 'nope.ckpt'}"],
        "does not exist",
    )
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"PK\x03\x04 truncated")
    fails_cleanly(
        capsys,
        ["test", *TINY_RUN, f"--trainer.default_root_dir={tmp_path}", f"--ckpt_path={corrupt}"],
        "not a readable checkpoint",
    )
    assert corrupt.read_bytes() == b"PK\x03\x04 truncated"
