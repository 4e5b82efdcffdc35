"""``multigpu/compat/checkpoint_index.py`` on a folder of shards written by the installed torch: every name its index
refers to is allowed and exists, any other is refused before it is imported, and the checked reader reads the folder
as torch does without unpickling the index or building an entry that is no tensor."""

from __future__ import annotations

import importlib
import io
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from multigpu import compat
from tests.helpers import RUNS_COMMAND_GLOBAL, RunsCommand

BATCHES = 4  # training batches per epoch of the small runs below


@pytest.fixture
def shards(tmp_path, one_process_group) -> Path:
    """A folder of shards as Lightning's ``ModelParallelStrategy`` saves one (``state_dict`` and ``optimizer_0`` of an
    FSDP2 model after an Adam step), written by the installed torch."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    folder = tmp_path / "last.ckpt"
    state = {"state_dict": get_model_state_dict(model), "optimizer_0": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=folder)
    return folder


def same(a: Any, b: Any) -> bool:
    """Equal nested checkpoints: the same keys, types and values, tensors equal in value and dtype."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def test_an_index_the_installed_torch_writes_holds_only_globals_the_index_unpickler_allows(shards):
    referenced = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            referenced.add((module, name))
            return super().find_class(module, name)

    with open(shards / ".metadata", "rb") as handle:
        plain = Recording(handle).load()
    assert ("torch.distributed.checkpoint.filesystem", "_StorageInfo") in referenced  # the file's real globals
    assert ("torch", "float32") in referenced and ("torch", "Size") in referenced
    refused = {f"{m}.{n}" for m, n in referenced if not compat.index_global_allowed(m, n)}
    assert not refused, f"add these to compat.CHECKPOINT_INDEX_GLOBALS if torch now writes them: {refused}"
    index = compat.read_checkpoint_index(shards / ".metadata")
    assert index == plain and compat.is_checkpoint_index(index)
    assert compat.shard_extents(index) == {"__0_0.distcp": (shards / "__0_0.distcp").stat().st_size}


def test_every_global_the_index_unpickler_allows_is_in_the_installed_torch():
    from torch.distributed.checkpoint import metadata

    for module, names in compat.CHECKPOINT_INDEX_GLOBALS.items():
        try:
            found = importlib.import_module(module)
        except ImportError:
            assert module == "pathlib._local" and sys.version_info < (3, 13)
            continue
        assert all(hasattr(found, name) for name in names), module
    # every class of torch's metadata module, and every dtype
    classes = {n for n, v in vars(metadata).items() if isinstance(v, type) and v.__module__ == metadata.__name__}
    assert all(compat.index_global_allowed(metadata.__name__, name) for name in classes)
    assert compat.index_global_allowed("torch", "bfloat16") and compat.index_global_allowed("torch", "int64")


def test_the_index_unpickler_refuses_any_other_global_before_it_runs(tmp_path):
    marker = tmp_path / "ran"
    for payload, name in (
        (RunsCommand(marker), RUNS_COMMAND_GLOBAL),
        (torch.load, "torch.serialization.load"),
        (subprocess.Popen, "subprocess.Popen"),
    ):
        (tmp_path / ".metadata").write_bytes(pickle.dumps(payload))
        with pytest.raises(compat.RefusedGlobal) as refused:
            compat.read_checkpoint_index(tmp_path / ".metadata")
        assert refused.value.name == name
    assert not marker.exists()
    assert not compat.index_global_allowed("torch", "load") and not compat.index_global_allowed("torch", "_C")
    assert not compat.is_checkpoint_index({"state_dict_metadata": {}, "storage_data": {}})


def test_a_checked_reader_reads_the_folder_as_torch_does_and_never_unpickles_the_index(shards, monkeypatch):
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(shards, shards.parent / "whole.pt")  # torch's own conversion, with its own reader
    expected = torch.load(shards.parent / "whole.pt", weights_only=False)
    index = compat.read_checkpoint_index(shards / ".metadata")

    def unpickled(*args: Any) -> None:
        raise AssertionError("torch unpickled the index itself")

    monkeypatch.setattr(filesystem.pickle, "load", unpickled)
    whole = compat.read_whole_checkpoint(compat.checked_reader(shards, index))
    assert same(whole, expected)
    assert expected["optimizer_0"]["param_groups"][0]["lr"] == 0.01  # an entry that is no tensor, read too
    entries = {entry: data for entry, shard, data in compat.non_tensor_entries(shards, index)}
    assert "optimizer_0.param_groups.0.lr" in entries and "state_dict.0.weight" not in entries
    assert torch.load(io.BytesIO(entries["optimizer_0.param_groups.0.lr"]), weights_only=True) == 0.01


def test_a_checked_reader_loads_an_entry_that_is_no_tensor_with_weights_only(tmp_path):
    import torch.distributed.checkpoint as dcp

    marker, folder = tmp_path / "ran", tmp_path / "shards"
    dcp.save({"weight": torch.ones(2), "settings": RunsCommand(marker)}, checkpoint_id=folder, no_dist=True)
    index = compat.read_checkpoint_index(folder / ".metadata")  # the index itself holds no code
    [(entry, shard, data)] = compat.non_tensor_entries(folder, index)
    assert (entry, shard) == ("settings", "__0_0.distcp")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(io.BytesIO(data), weights_only=True)
    with pytest.raises(dcp.CheckpointException, match="weights_only"):
        dcp.load({"weight": torch.zeros(2), "settings": None}, storage_reader=compat.checked_reader(folder, index))
    assert not marker.exists()
