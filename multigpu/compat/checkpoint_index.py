"""torch.distributed.checkpoint's private names, for reading a folder of shards without running code: its index, which
torch reads with a plain ``pickle.load``, unpickled with its metadata classes only, and a reader given that index."""

from __future__ import annotations

import functools
import io
import pickle
from pathlib import Path
from typing import IO, Any

import torch

#: the globals a folder's ``.metadata`` refers to, by module (``torch.strided`` pickles as a call of ``_get_layout``)
CHECKPOINT_INDEX_GLOBALS: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "collections": frozenset({"OrderedDict"}),
    # pathlib's classes live in pathlib._local from Python 3.13 on
    **dict.fromkeys(
        ("pathlib", "pathlib._local"),
        frozenset({"PurePath", "PurePosixPath", "PureWindowsPath", "Path", "PosixPath", "WindowsPath"}),
    ),
}


def index_global_allowed(module: str, name: str) -> bool:
    """Whether ``module.name`` may be built while an index is unpickled (``getattr`` would import lazy submodules)."""
    if name in CHECKPOINT_INDEX_GLOBALS.get(module, ()):
        return True
    return module == "torch" and isinstance(vars(torch).get(name), torch.dtype)


class RefusedGlobal(pickle.UnpicklingError):
    """A global that ``CheckpointIndexUnpickler`` refused, before looking it up."""

    def __init__(self, name: str) -> None:
        super().__init__(f"global {name} is not one of torch's checkpoint metadata classes")
        self.name = name


class CheckpointIndexUnpickler(pickle.Unpickler):
    """An unpickler that builds only what an index of ``torch.distributed.checkpoint`` holds, refusing any other
    global before it is imported (``find_class`` is the one place a pickle names a callable)."""

    def find_class(self, module: str, name: str) -> Any:
        if not index_global_allowed(module, name):
            raise RefusedGlobal(f"{module}.{name}")
        return super().find_class(module, name)


def read_checkpoint_index(file: str | Path) -> Any:
    """The object a folder's index (``.metadata``) holds, unpickled by ``CheckpointIndexUnpickler``."""
    with open(file, "rb") as handle:
        return CheckpointIndexUnpickler(handle).load()


def is_checkpoint_index(index: Any) -> bool:
    """Whether ``index`` has the layout torch's file reader relies on."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

    if not isinstance(index, Metadata):
        return False
    entries, storage = getattr(index, "state_dict_metadata", None), getattr(index, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        return False
    return all(
        isinstance(key, MetadataIndex)
        and isinstance(info, _StorageInfo)
        and isinstance(info.relative_path, str)
        and all(isinstance(n, int) and n >= 0 for n in (info.offset, info.length))
        for key, info in storage.items()
    )


def shard_extents(index: Any) -> dict[str, int]:
    """Each shard file a checked index names (relative to its folder), with the bytes it must hold at least."""
    extents: dict[str, int] = {}
    for info in index.storage_data.values():
        extents[info.relative_path] = max(extents.get(info.relative_path, 0), info.offset + info.length)
    return extents


def non_tensor_entries(folder: str | Path, index: Any) -> list[tuple[str, str, bytes]]:
    """``(entry, shard file, bytes)`` of every entry of a checked index that is no tensor, read as torch's file reader
    reads them, without building them."""
    from torch.distributed.checkpoint import FileSystemReader, LoadPlan, ReadItem
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    from torch.distributed.checkpoint.planner import LoadItemType

    at, nothing = torch.Size((0,)), torch.Size((0,))
    items = [
        ReadItem(LoadItemType.BYTE_IO, key, at, key, at, nothing)
        for key in index.storage_data
        if isinstance(index.state_dict_metadata.get(key.fqn), BytesStorageMetadata)
    ]
    entries: list[tuple[str, str, bytes]] = []

    class Collect:
        def load_bytes(self, item: Any, value: io.BytesIO) -> None:
            entries.append((item.storage_index.fqn, index.storage_data[item.storage_index].relative_path, value.read()))

    reader = FileSystemReader(folder)
    reader.set_up_storage_reader(index, True)
    reader.read_data(LoadPlan(items), Collect()).wait()  # type: ignore[arg-type]
    return entries


class WeightsOnlyEntries:
    """A load planner that reads each entry that is no tensor with ``weights_only=True`` (torch's planners do not)."""

    def __init__(self, planner: Any) -> None:
        self.planner = planner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.planner, name)

    def load_bytes(self, read_item: Any, value: IO[bytes]) -> None:
        entry = torch.load(value, map_location="cpu", weights_only=True)
        checked = io.BytesIO()
        torch.save(entry, checked)
        checked.seek(0)
        self.planner.load_bytes(read_item, checked)


@functools.cache
def checked_reader_class() -> type:
    """``FileSystemReader`` given an index already read and checked, which ``read_metadata`` hands torch instead of
    unpickling the file. Defined when first used: ``torch.distributed.checkpoint`` is imported late."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class CheckedIndexReader(FileSystemReader):
        def __init__(self, path: str | Path, index: Any) -> None:
            super().__init__(path)
            self.index = index

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if getattr(self.index, "storage_meta", None) is None:  # what torch's read_metadata adds
                self.index.storage_meta = StorageMeta()
            self.index.storage_meta.load_id = self.load_id
            return self.index

        def read_data(self, plan: Any, planner: Any) -> Any:
            return super().read_data(plan, WeightsOnlyEntries(planner))

    return CheckedIndexReader


def checked_reader(folder: str | Path, index: Any) -> Any:
    """A ``StorageReader`` of ``folder`` for ``torch.distributed.checkpoint.load``, given its checked index."""
    return checked_reader_class()(folder, index)


def read_whole_checkpoint(reader: Any) -> dict[str, Any]:
    """Every entry of a folder of shards in one nested dict, without a process group, as ``dcp_to_torch_save`` reads
    them (the public ``load`` fills only the keys given)."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state
