"""Checkpoint files: written atomically and durably next to their destination, and checked before a resume.

Lightning's local save stages the file in ``$TMPDIR`` and moves it into place, which is a copy where ``/tmp`` is
another file system (the usual cluster layout): a job killed during it leaves a truncated ``last.ckpt``.
``AtomicCheckpointIO`` writes, fsyncs and renames a temporary file in the destination folder instead.
"""

from __future__ import annotations

import logging
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from src.sharded_checkpoint import fsync_directory, is_sharded_checkpoint, load_sharded_checkpoint

log = logging.getLogger(__name__)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` that replaces ``path`` only once the new file is complete and on disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        leftover.unlink(missing_ok=True)  # a write of this file that was killed; only one process writes it
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)  # atomic within one file system
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        cause = _file_error(error)
        if cause is not None:  # a full disk or a read-only folder: say so, with the checkpoint's path
            raise OSError(cause.errno, cause.strerror, str(path)) from error
        raise
    fsync_directory(path.parent)  # the rename itself survives a power loss


def _file_error(error: BaseException) -> OSError | None:
    """The file system's error behind a failed save. torch's zip writer reports a failed write of the file as
    ``RuntimeError: ... unexpected pos``, with the ``OSError`` (``ENOSPC``: disk full) only as its context."""
    for candidate in (error, error.__context__):
        if isinstance(candidate, OSError) and candidate.errno is not None and not candidate.filename:
            return candidate
    return None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with atomic, durable local saves (remote URLs keep Lightning's path)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> Any:
        if is_sharded_checkpoint(path):  # a folder saved under fsdp2 / tensor_parallel, read whole
            return load_sharded_checkpoint(path)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def is_intact(path: Path) -> bool:
    """Whether ``path`` is a complete ``torch.save`` archive: every member present and matching its checksum."""
    if Path(path).is_dir():
        return is_sharded_checkpoint(path)
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def newest_intact_checkpoint(folder: Path, skip: Path | None = None) -> Path | None:
    """The most recently written intact ``*.ckpt`` in ``folder`` other than ``skip``."""
    candidates = sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((p for p in candidates if p != skip and is_intact(p)), None)
