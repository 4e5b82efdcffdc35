"""``multigpu/checkpoints/safe.py``: no file a command reads runs code. Files crafted here (a pickle whose unpickling
runs ``os.system`` and would create a marker file) in every place of a checkpoint (a single file, a folder's index,
an entry of a shard, ``meta.pt``), and folders that are damaged or of another layout, are each refused in one
paragraph naming the file: by the check itself, and through the public commands (evaluation on one device and
under ddp, an fsdp2 resume, ``python -m multigpu.consolidate``), with exit status 2, the marker absent and the files
unchanged. A folder a real fsdp2 run saved (the installed torch and Lightning) passes.

The fast checks of the reading pieces are in tests/compat/test_checkpoint_index.py; the resumes of trained sharded runs
in tests/strategies/test_model_parallel.py and tests/examples/."""

from __future__ import annotations

import hashlib
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from multigpu.checkpoints.safe import INDEX_FILE, METADATA_FILE, check_sharded_checkpoint, read_torch_file
from multigpu.errors import ConfigurationError
from tests import prewarmed
from tests.cli import main
from tests.conftest import REPO, TINY, TINY_RUN, cli_env
from tests.errors.test_errors import fails_cleanly, resume
from tests.helpers import RUNS_COMMAND_GLOBAL, RunsCommand, entry_runs_code

SHARD = "__0_0.distcp"  # the one shard of a one-process fsdp2 run
#: the tests share one saved run: one worker saves it once
pytestmark = pytest.mark.xdist_group("test_safe")


REFUSED = RUNS_COMMAND_GLOBAL  # posix.system


def command(*args: str, module: str = "tests.cli") -> subprocess.CompletedProcess:
    return prewarmed.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """The run directory of two fsdp2 steps on one process: ``checkpoints/last.ckpt`` is a folder of shards."""
    run_dir = tmp_path_factory.mktemp("saved")
    result = command("fit", *TINY, f"--trainer.default_root_dir={run_dir}", "--trainer.strategy=fsdp2",
                     "--trainer.max_steps=2")  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return run_dir


def digest(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def one_paragraph(result: subprocess.CompletedProcess, *needles: str) -> str:
    """The command's one paragraph on stderr, with exit status 2, no traceback and no rank's own report."""
    assert result.returncode == 2, result.stderr[-4000:]
    err = result.stderr
    assert "Traceback" not in err and "(rank " not in err, err
    err = err[err.index("error: ") :]
    assert len(err.strip().splitlines()) == 1 and "Fix:" in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err}"
    return err


# -- what a crafted or damaged folder holds ----------------------------------------------------------------------


def index_runs_code(folder: Path, marker: Path) -> None:
    (folder / INDEX_FILE).write_bytes(pickle.dumps(RunsCommand(marker)))


def meta_runs_code(folder: Path, marker: Path) -> None:
    meta = torch.load(folder / METADATA_FILE, weights_only=True)
    torch.save({**meta, "hyper_parameters": RunsCommand(marker)}, folder / METADATA_FILE)


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CRAFTED: dict[str, tuple[Callable[[Path, Path], None], list[str]]] = {
    "index that runs code": (index_runs_code, [INDEX_FILE, f"holds {REFUSED}", "dcp_to_torch_save"]),
    "entry that runs code": (entry_runs_code, [SHARD, REFUSED, "optimizer_0.param_groups.0.lr", "add_safe_globals"]),
    "meta.pt that runs code": (meta_runs_code, [METADATA_FILE, REFUSED, "add_safe_globals"]),
}
DAMAGED: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "missing index": (lambda f: (f / INDEX_FILE).unlink(), ["not a complete sharded checkpoint", f"no {INDEX_FILE}"]),
    "truncated index": (lambda f: cut(f / INDEX_FILE), [INDEX_FILE, "truncated or corrupt"]),
    "foreign index": (lambda f: (f / INDEX_FILE).write_bytes(pickle.dumps({"a": 1})), ["holds a dict", "not an index"]),
    "missing shard": (lambda f: (f / SHARD).unlink(), [f"no shard file {SHARD}"]),
    "truncated shard": (lambda f: cut(f / SHARD), [SHARD, "is truncated"]),
    "meta.pt not a dict": (lambda f: torch.save([1], f / METADATA_FILE), [METADATA_FILE, "holds a list"]),
    "meta.pt of another layout": (
        lambda f: torch.save({"state_dict": {}}, f / METADATA_FILE),
        [METADATA_FILE, "without 'pytorch-lightning_version'"],
    ),
    "meta.pt truncated": (lambda f: cut(f / METADATA_FILE), [METADATA_FILE, "not a readable checkpoint"]),
}


def copy_of(saved: Path, tmp_path: Path) -> Path:
    """A copy of the saved run directory; its ``checkpoints/last.ckpt`` folder is the test's to change."""
    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    return run_dir


# -- the check -------------------------------------------------------------------------------------------------


def test_a_folder_a_real_run_saved_passes_the_check(saved):
    checked = check_sharded_checkpoint(saved / "checkpoints" / "last.ckpt")
    assert checked.meta["global_step"] == 2 and "loops" in checked.meta and "callbacks" in checked.meta
    assert "state_dict.net.0.weight" in checked.index.state_dict_metadata


@pytest.mark.parametrize("case", CRAFTED)
def test_a_folder_that_would_run_code_is_refused_before_anything_in_it_runs(saved, tmp_path, case):
    craft, needles = CRAFTED[case]
    folder, marker = copy_of(saved, tmp_path) / "checkpoints" / "last.ckpt", tmp_path / "ran"
    craft(folder, marker)
    before = digest(folder)
    with pytest.raises(ConfigurationError) as refused:
        check_sharded_checkpoint(folder)
    assert all(needle in str(refused.value) for needle in needles), str(refused.value)
    assert "\n" not in str(refused.value) and "Fix:" in str(refused.value)
    assert not marker.exists() and digest(folder) == before


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_folder_or_one_of_another_layout_is_one_paragraph(saved, tmp_path, case):
    damage, needles = DAMAGED[case]
    folder = copy_of(saved, tmp_path) / "checkpoints" / "last.ckpt"
    damage(folder)
    before = digest(folder)
    with pytest.raises(ConfigurationError) as refused:
        check_sharded_checkpoint(folder)
    assert all(needle in str(refused.value) for needle in needles), str(refused.value)
    assert "\n" not in str(refused.value) and "Fix:" in str(refused.value)
    assert digest(folder) == before


def test_a_single_file_that_would_run_code_is_refused_with_how_to_allow_it(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "given.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.6", "hyper_parameters": RunsCommand(marker)}, path)
    with pytest.raises(ConfigurationError) as refused:
        read_torch_file(path)
    assert f"{path} holds Python objects besides tensors ({REFUSED})" in str(refused.value)
    assert "torch.serialization.add_safe_globals" in str(refused.value)  # how a user who trusts the file allows it
    assert not marker.exists()


# -- through the commands ----------------------------------------------------------------------------------------


def test_evaluating_a_file_that_would_run_code_is_refused(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "given.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": {}, "extra": RunsCommand(marker)}, path)
    before = digest(path)
    result = command("validate", *TINY, f"--trainer.default_root_dir={tmp_path / 'run'}", f"--ckpt_path={path}")
    one_paragraph(result, f"--ckpt_path={path} holds Python objects besides tensors ({REFUSED})")
    assert not marker.exists() and digest(path) == before


def test_evaluating_a_folder_on_one_device_whose_meta_would_run_code_is_refused(saved, tmp_path):
    folder, marker = copy_of(saved, tmp_path) / "checkpoints" / "last.ckpt", tmp_path / "ran"
    meta_runs_code(folder, marker)
    before = digest(folder)
    result = command("validate", *TINY, f"--trainer.default_root_dir={tmp_path / 'eval'}", f"--ckpt_path={folder}")
    one_paragraph(result, str(folder / METADATA_FILE), REFUSED)
    assert not marker.exists() and digest(folder) == before


def test_an_fsdp2_resume_from_an_index_that_would_run_code_is_refused_before_launch(saved, tmp_path):
    run_dir, marker = copy_of(saved, tmp_path), tmp_path / "ran"
    folder = run_dir / "checkpoints" / "last.ckpt"
    index_runs_code(folder, marker)
    before = digest(run_dir / "checkpoints")
    result = command("fit", *TINY, f"--trainer.default_root_dir={run_dir}", "--trainer.strategy=fsdp2",
                     "--trainer.devices=2", "--trainer.max_steps=4", "--ckpt_path=last")  # fmt: skip
    one_paragraph(result, str(folder / INDEX_FILE), f"holds {REFUSED}")
    assert not marker.exists() and digest(run_dir / "checkpoints") == before


def test_evaluating_a_folder_with_a_missing_shard_under_ddp_is_one_paragraph(saved, tmp_path):
    folder = copy_of(saved, tmp_path) / "checkpoints" / "last.ckpt"
    (folder / SHARD).unlink()
    result = command("test", *TINY, f"--trainer.default_root_dir={tmp_path / 'eval'}", "--trainer.strategy=ddp",
                     "--trainer.devices=2", f"--ckpt_path={folder}")  # fmt: skip
    one_paragraph(result, f"has no shard file {SHARD}")


def test_consolidating_a_folder_whose_shard_would_run_code_is_refused(saved, tmp_path):
    folder, marker = copy_of(saved, tmp_path) / "checkpoints" / "last.ckpt", tmp_path / "ran"
    entry_runs_code(folder, marker)
    before = digest(folder)
    result = command(str(folder), str(tmp_path / "whole.ckpt"), module="multigpu.consolidate")
    one_paragraph(result, str(folder / SHARD), REFUSED)
    assert not marker.exists() and digest(folder) == before and not (tmp_path / "whole.ckpt").exists()


# -- a single-file checkpoint through the command line ----------------------------------------------------------


class Opaque:
    """An object that only full unpickling can rebuild: weights_only loading refuses it."""


def test_checkpoint_with_python_objects_is_refused_unless_its_classes_are_allowed(tmp_path, capsys, untouched):
    checkpoint = torch.load(untouched / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["opaque"] = Opaque()
    unsafe = tmp_path / "unsafe.ckpt"
    torch.save(checkpoint, unsafe)
    fails_cleanly(
        capsys,
        ["validate", *TINY_RUN, f"--trainer.default_root_dir={tmp_path}", f"--ckpt_path={unsafe}"],
        "tests.checkpoints.test_safe.Opaque",
        "trust",
    )
    capsys.readouterr()
    with torch.serialization.safe_globals([Opaque]):  # the documented way to load a trusted checkpoint with objects
        main(["validate", *TINY_RUN, f"--trainer.default_root_dir={tmp_path}", f"--ckpt_path={unsafe}"])
    assert "val/loss" in capsys.readouterr().out


def test_resume_loads_with_weights_only(tmp_path, capsys, untouched, monkeypatch):
    """The template's own checkpoints load with ``weights_only=True``: no pickled code is run on resume."""
    run_dir = tmp_path / "copy"
    shutil.copytree(untouched, run_dir)
    loads: list[object] = []
    original = torch.load

    def recording_load(*args, **kwargs):
        loads.append(kwargs.get("weights_only"))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    main(resume(run_dir, "--trainer.max_steps=3"))
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    assert loads and all(flag in (True, None) for flag in loads), loads
    assert torch.__version__ >= "2.6"  # torch.load's weights_only=None means True from torch 2.6 on
