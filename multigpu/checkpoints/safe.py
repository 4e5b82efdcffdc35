"""Reading a checkpoint a command may not have written without running code: files with ``weights_only``, a
folder of shards checked whole (its index unpickled with torch's metadata classes only) before torch reads it."""

from __future__ import annotations

import io
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from multigpu.compat import (
    RefusedGlobal,
    is_checkpoint_index,
    non_tensor_entries,
    read_checkpoint_index,
    shard_extents,
)
from multigpu.errors import ConfigurationError, describe

# Lightning's _METADATA_FILENAME
METADATA_FILE = "meta.pt"
INDEX_FILE = ".metadata"
LIGHTNING_VERSION_KEY = "pytorch-lightning_version"
ALLOW_TRUSTED = (
    "if you trust where the file came from, allow those classes with torch.serialization.add_safe_globals([...])"
    " in your model's module, or re-save the checkpoint without them (the engine's docs/troubleshooting.md,"
    " Checkpoints)."
)
FOLDER_FIX = (
    "pass a checkpoint folder a run of this template saved (e.g. runs/NAME/checkpoints/last.ckpt, or an earlier"
    " best-*.ckpt beside it); the folder is left as it is."
)


@dataclass
class CheckedFolder:
    index: Any
    meta: dict[str, Any]


def refused_globals(source: str | Path | IO[bytes], error: Exception) -> str:
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(source)
    except Exception:  # not a zip archive torch wrote: the refusal's own text names the global
        found = re.findall(r"GLOBAL (\S+) was not an allowed global", str(error))
    return ", ".join(found) or "objects weights_only loading does not allow"


def read_torch_file(path: Path, name: str | None = None, mmap: bool = False, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``; a refusal or a damaged file is one paragraph naming ``name``."""
    name = name or str(path)
    try:
        return torch.load(path, map_location=map_location, mmap=mmap, weights_only=True)
    except pickle.UnpicklingError as error:
        raise ConfigurationError(
            f"{name} holds Python objects besides tensors ({refused_globals(path, error)}), which safe loading"
            f" (torch.load weights_only=True) refuses: unpickling them could run any code. Fix: {ALLOW_TRUSTED}"
        ) from error
    except Exception as error:
        raise ConfigurationError(
            f"{name} is not a readable checkpoint (truncated or corrupt, {path.stat().st_size} bytes:"
            f" {describe(error)}). Fix: pass an earlier checkpoint from the same folder, e.g. a best-*.ckpt file;"
            " the file is left as is."
        ) from error


def read_index(folder: Path) -> Any:
    """The index of a folder of shards, unpickled with torch's checkpoint metadata classes only, and checked."""
    file = folder / INDEX_FILE
    what = f"{file}, the index of the sharded checkpoint {folder},"
    try:
        index = read_checkpoint_index(file)
    except RefusedGlobal as error:
        raise ConfigurationError(
            f"{what} holds {error.name}, which an index that torch.distributed.checkpoint writes never holds (only"
            " its metadata classes, sizes, dtypes and a path): unpickling it could run any code, so nothing in it"
            " was built or run. Fix: if you trust where the folder came from all the same, have it converted to one"
            " file there (torch.distributed.checkpoint.format_utils.dcp_to_torch_save, which unpickles the index as"
            " it is) and pass that file, which is read with weights_only; the folder is left as it is."
        ) from error
    except Exception as error:
        raise ConfigurationError(
            f"{what} is truncated or corrupt ({file.stat().st_size} bytes: {describe(error)}). Fix: {FOLDER_FIX}"
        ) from error
    if not is_checkpoint_index(index):
        raise ConfigurationError(
            f"{what} is not an index torch.distributed.checkpoint writes (it holds a {type(index).__name__}, not"
            f" its Metadata of entries and shard files). Fix: {FOLDER_FIX}"
        )
    return index


def check_shard_files(folder: Path, index: Any) -> None:
    for name, extent in shard_extents(index).items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise ConfigurationError(
                f"{folder / INDEX_FILE} names a shard outside its folder ({name!r}), which torch never writes."
                f" Fix: {FOLDER_FIX}"
            )
        shard = folder / name
        if not shard.is_file():
            raise ConfigurationError(
                f"the sharded checkpoint {folder} has no shard file {name}, which its index {INDEX_FILE} names (a"
                f" copy cut short, or a file deleted). Fix: copy the whole folder again, or {FOLDER_FIX}"
            )
        if shard.stat().st_size < extent:
            raise ConfigurationError(
                f"{shard} is truncated ({shard.stat().st_size} bytes; the index {INDEX_FILE} places {extent} in it)."
                f" Fix: copy the whole folder again, or {FOLDER_FIX}"
            )


def check_non_tensor_entries(folder: Path, index: Any) -> None:
    try:
        entries = non_tensor_entries(folder, index)
    except Exception as error:
        raise ConfigurationError(
            f"the shards of {folder} cannot be read as their index {INDEX_FILE} describes them ({describe(error)})."
            f" Fix: {FOLDER_FIX}"
        ) from error
    for entry, shard, data in entries:
        try:
            torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            raise ConfigurationError(
                f"{folder / shard} holds Python objects besides tensors ({refused_globals(io.BytesIO(data), error)})"
                f" in its entry {entry}, which safe loading (torch.load weights_only=True) refuses: unpickling them"
                f" could run any code. Fix: {ALLOW_TRUSTED}"
            ) from error
        except Exception as error:
            raise ConfigurationError(
                f"{folder / shard} is corrupt: its entry {entry} does not load ({describe(error)}). Fix: {FOLDER_FIX}"
            ) from error


def check_sharded_checkpoint(folder: Path, map_location: Any = "cpu") -> CheckedFolder:
    """Read and check a folder of shards before torch reads any of it; each problem is one paragraph naming the file."""
    missing = [name for name in (INDEX_FILE, METADATA_FILE) if not (folder / name).is_file()]
    if not folder.is_dir() or missing:
        has = "" if not folder.is_dir() else f": it has no {' and no '.join(missing)}"
        raise ConfigurationError(
            f"{folder} is not a complete sharded checkpoint (shards, {INDEX_FILE} and {METADATA_FILE}){has}. Fix:"
            " pass a folder a run under --trainer.strategy=fsdp2, tensor_parallel or pipeline saved, e.g."
            " runs/NAME/checkpoints/last.ckpt."
        )
    index = read_index(folder)
    check_shard_files(folder, index)
    check_non_tensor_entries(folder, index)
    meta = read_torch_file(folder / METADATA_FILE, map_location=map_location)
    if not isinstance(meta, dict) or LIGHTNING_VERSION_KEY not in meta:
        held = f"a dict without {LIGHTNING_VERSION_KEY!r}" if isinstance(meta, dict) else f"a {type(meta).__name__}"
        raise ConfigurationError(
            f"{folder / METADATA_FILE} is not the state Lightning saves beside the shards (a dict with"
            f" {LIGHTNING_VERSION_KEY!r}, 'loops' and 'callbacks'): it holds {held}. Fix: {FOLDER_FIX}"
        )
    return CheckedFolder(index, meta)
