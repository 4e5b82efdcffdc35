"""Sharded checkpoints (``fsdp2``, ``tensor_parallel``, ``pipeline``): a folder of shards and ``meta.pt``,
replaced atomically and read whole (docs/checkpoints.md).

The ranks write into ``.NAME.partial``; rank 0 moves the old folder aside (``.NAME.old``) and the new one into
place. A kill between the two renames leaves ``.NAME.old`` whole, which ``restore_interrupted`` puts back."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from multigpu.checkpoints.crc32 import without_crc32
from multigpu.checkpoints.safe import INDEX_FILE, METADATA_FILE, CheckedFolder, check_sharded_checkpoint
from multigpu.compat import checked_reader, read_whole_checkpoint
from multigpu.errors import ConfigurationError, describe


def is_sharded_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / METADATA_FILE).is_file() and (path / INDEX_FILE).is_file()


def staging_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.partial")


def _aside_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.old")


def move_into_place(staging: Path, final: Path) -> None:
    aside = _aside_path(final)
    shutil.rmtree(aside, ignore_errors=True)
    if final.exists():
        os.replace(final, aside)
    os.replace(staging, final)
    fsync_directory(final.parent)
    if aside.is_dir():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


def restore_interrupted(folder: str | Path) -> None:
    folder = Path(folder)
    if not folder.is_dir():
        return
    for aside in folder.glob(".*.ckpt.old"):
        final = aside.with_name(aside.name[1 : -len(".old")])
        if not final.exists():
            os.replace(aside, final)


def fsync_directory(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # some file systems do not open directories
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def shard_writer(folder: Path) -> Any:
    """torch's ``FileSystemWriter`` whose failed write reports the file system's ``OSError`` with its errno: torch's
    says "unexpected pos", and other ranks' failures arrive pickled, without the context that held the errno."""
    from torch.distributed.checkpoint import FileSystemWriter

    class ShardWriter(FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            try:
                with without_crc32():
                    return super().write_data(plan, planner)
            except Exception as error:
                cause = file_system_cause(error)
                if cause is None:
                    raise
                raise OSError(cause.errno, cause.strerror) from error

    return ShardWriter(folder)


def file_system_cause(error: BaseException) -> OSError | None:
    for candidate in (error, error.__context__, error.__cause__):
        if isinstance(candidate, OSError) and candidate.errno is not None:
            return candidate
    return None


def write_shards(shards: dict[str, Any], folder: Path, checkpoint: Path, process_group: Any = None) -> None:
    import torch.distributed.checkpoint as dcp

    raise_shard_failure(
        lambda: dcp.save(shards, storage_writer=shard_writer(folder), process_group=process_group), checkpoint
    )


def raise_shard_failure(write: Any, checkpoint: Path) -> Any:
    """``write()``; a file system failure on any rank raised on every rank as the ``OSError`` naming ``checkpoint``."""
    from torch.distributed.checkpoint import CheckpointException

    try:
        return write()
    except CheckpointException as error:
        for failure, _ in error.failures.values():
            cause = file_system_cause(failure)
            if cause is not None:
                raise OSError(cause.errno, cause.strerror, str(checkpoint)) from error
        raise


def _optimizer_state_by_position(state: dict[str, Any]) -> dict[str, Any]:
    # torch.distributed.checkpoint keys it by parameter name; Optimizer.load_state_dict wants positions
    names = [name for group in state["param_groups"] for name in group["params"]]
    if not names or isinstance(names[0], int):
        return state
    position = {name: index for index, name in enumerate(names)}
    return {
        "state": {position[name]: value for name, value in state.get("state", {}).items()},
        "param_groups": [
            {**group, "params": [position[name] for name in group["params"]]} for group in state["param_groups"]
        ],
    }


def _optimizer_state_from_flat(flat: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """A ``pipeline`` checkpoint's flat optimizer state in one device's layout, by the positions in ``order``."""
    # a tied weight is in ``order`` under its first name only: its other copy's entries are dropped
    position = {name: index for index, name in enumerate(order)}
    state: dict[int, dict[str, Any]] = {}
    settings: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        kind, _, rest = key.partition(".")
        name, _, field = rest.rpartition(".")
        if name not in position:
            continue
        if kind == "state":
            state.setdefault(position[name], {})[field] = value
        elif kind == "param_groups":
            settings.setdefault(name, {})[field] = value
    groups: list[dict[str, Any]] = []
    for name in order:
        group = next((g for g in groups if all(g[k] == v for k, v in settings.get(name, {}).items())), None)
        if group is None:
            group = {**settings.get(name, {}), "params": []}
            groups.append(group)
        group["params"].append(position[name])
    return {"state": state, "param_groups": groups}


def load_sharded_checkpoint(folder: str | Path) -> dict[str, Any]:
    """The whole checkpoint of a sharded folder in the single-file layout, checked first, in host memory."""
    folder = Path(folder)
    checked = check_sharded_checkpoint(folder)
    checkpoint = read_shards(folder, checked, read_whole_checkpoint)
    checkpoint.update(checked.meta)
    optimizer_keys = sorted((k for k in checkpoint if re.fullmatch(r"optimizer_\d+", k)), key=lambda k: int(k[10:]))
    order = (checkpoint.get("pipeline") or {}).get("parameter_order")
    if optimizer_keys:
        checkpoint["optimizer_states"] = [
            _optimizer_state_from_flat(checkpoint.pop(k), order)
            if order
            else _optimizer_state_by_position(checkpoint.pop(k))
            for k in optimizer_keys
        ]
    return checkpoint


def load_shards(
    folder: Path,
    checked: CheckedFolder,
    model: nn.Module,
    optimizers: Sequence[Any],
    strict: bool = True,
    optimizer_options: Any = None,
) -> None:
    """Read a checked folder into a sharded ``model`` and its ``optimizers``, each rank its part."""
    # imported here: every run imports this module, few read shards
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    def into(state: dict[str, Any]) -> dict[str, Any]:
        read_shards(folder, checked, lambda reader: dcp.load(state, storage_reader=reader))
        return state

    model.load_state_dict(into({"state_dict": get_model_state_dict(model)})["state_dict"], strict=strict)
    setting = optimizer_options or StateDictOptions(cpu_offload=True)
    for index, optimizer in enumerate(optimizers):
        key = f"optimizer_{index}"
        state = into({key: get_optimizer_state_dict(model, optimizer, options=optimizer_options)})
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state[key], options=setting)


def read_shards(folder: Path, checked: CheckedFolder, read: Any) -> Any:
    """``read(reader)`` with a reader of ``folder`` given its checked index; a failure is one paragraph."""
    from torch.distributed.checkpoint import CheckpointException

    try:
        return read(checked_reader(folder, checked.index))
    except CheckpointException as error:
        failures = [failure for failure, _ in error.failures.values()]
        raise ConfigurationError(
            f"the shards of {folder} could not be read"
            f" ({'; '.join(dict.fromkeys(describe(f) for f in failures)) or describe(error)}). Fix: pass an intact"
            " checkpoint folder (e.g. an earlier best-*.ckpt beside it); the folder is left as it is."
        ) from error
