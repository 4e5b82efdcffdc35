"""Checkpoint files written atomically and durably beside their destination, and what "intact" means.

Lightning stages a save in ``$TMPDIR``, where a move onto another file system is a copy a kill can cut short."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import CheckpointIO, TorchCheckpointIO

from multigpu.checkpoints.crc32 import without_crc32
from multigpu.checkpoints.sharded import (
    fsync_directory,
    is_sharded_checkpoint,
    load_sharded_checkpoint,
    move_into_place,
    staging_path,
)

log = logging.getLogger(__name__)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` that replaces ``path`` only once the new file is complete and on disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        leftover.unlink(missing_ok=True)  # a write of this file that was killed; only one process writes it
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file, without_crc32():
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        cause = _file_error(error)
        if cause is not None:
            raise OSError(cause.errno, cause.strerror, str(path)) from error
        raise
    fsync_directory(path.parent)


def link_checkpoint(source: str | os.PathLike, path: str | os.PathLike) -> None:
    """Make ``path`` another name of checkpoint ``source``: a hard link (a copy where there are none), renamed into
    place as a save is."""
    source, path = Path(source), Path(path)
    if source.resolve() == path.resolve():
        return
    if source.is_dir():
        staging = staging_path(path)
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging, copy_function=_link_or_copy)
        move_into_place(staging, path)
        return
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        leftover.unlink(missing_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.link.tmp")
    try:
        _link_or_copy(source, temporary)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def _link_or_copy(source: str | os.PathLike, target: str | os.PathLike) -> None:
    try:
        os.link(source, target)
    except OSError:  # some network and FUSE file systems have no hard links
        shutil.copyfile(source, target)
        with open(target, "rb+") as file:
            os.fsync(file.fileno())


def _file_error(error: BaseException) -> OSError | None:
    # torch's zip writer reports a full disk as "RuntimeError: ... unexpected pos", the OSError only its context
    for candidate in (error, error.__context__):
        if isinstance(candidate, OSError) and candidate.errno is not None and not candidate.filename:
            return candidate
    return None


def with_atomic_io(plugins: Any, atomic_io: CheckpointIO | None = None) -> list[Any]:
    """The user's ``--trainer.plugins``, plus ``atomic_io`` unless they chose a ``CheckpointIO``."""
    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
        plugins.append(atomic_io or AtomicCheckpointIO())
    return plugins


def remove_leftovers(folder: Path) -> None:
    """Delete the temporary files of checkpoint writes a kill interrupted in ``folder``."""
    for leftover in folder.glob(".*.ckpt.*.tmp"):
        leftover.unlink(missing_ok=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with atomic, durable local saves (remote URLs keep Lightning's path)."""

    def __init__(self) -> None:
        super().__init__()
        self._cleaned: set[Path] = set()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        self.clean_once(Path(path).parent)
        atomic_torch_save(checkpoint, path)

    def clean_once(self, folder: Path) -> None:
        # once per run: a best file of another step is never written again to delete its own leftovers
        if folder not in self._cleaned:
            self._cleaned.add(folder)
            remove_leftovers(folder)

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> Any:
        # weights_only unless told otherwise: Lightning's default for a URL is False
        if os.path.isdir(path):
            return load_sharded_checkpoint(path)
        weights_only = True if weights_only is None else weights_only
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def is_intact(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a complete checkpoint: a sharded folder with its index and ``meta.pt``, or a
    ``torch.save`` archive whose zip directory (written last) names its pickle. A flipped bit inside passes."""
    path = Path(path)
    if path.is_dir():
        return is_sharded_checkpoint(path)
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") or name == "data.pkl" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def newest_intact_checkpoint(folder: Path, skip: Path | None = None) -> Path | None:
    """The most recently written intact ``*.ckpt`` in ``folder`` other than ``skip``."""
    candidates = sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((p for p in candidates if p != skip and is_intact(p)), None)
