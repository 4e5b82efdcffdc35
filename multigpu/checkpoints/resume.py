"""Which checkpoint a command resumes or evaluates: ``--ckpt_path`` resolved and read once, before launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from multigpu.checkpoints.files import is_intact, newest_intact_checkpoint
from multigpu.checkpoints.safe import read_torch_file
from multigpu.checkpoints.sharded import check_sharded_checkpoint, is_sharded_checkpoint, restore_interrupted
from multigpu.errors import ConfigurationError, notice
from multigpu.facts import RunFacts

SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")


def checkpoint_dir(run_dir: str | None) -> str:
    """Where ``ModelCheckpoint`` and preemption save, stable across restarts."""
    return str(Path(run_dir or Path.cwd()) / "checkpoints")


def resolve_checkpoint(facts: RunFacts, options: Namespace) -> tuple[Path, dict[str, Any] | None] | None:
    """The local checkpoint ``--ckpt_path`` names and its contents (None for a folder of shards), or None; a damaged
    ``last`` replaced in ``options``, which Lightning loads from, by the intact checkpoint read instead."""
    subcommand, ckpt_path, run_dir = facts.subcommand, facts.ckpt_path_option, facts.run_dir
    folder = Path(checkpoint_dir(str(run_dir)))
    if ckpt_path == "last":
        restore_interrupted(folder)
    existing = sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    if ckpt_path is None:
        if subcommand == "fit" and existing:
            raise ConfigurationError(
                f"--trainer.default_root_dir={run_dir} already holds a run ({len(existing)} checkpoint(s) in"
                f" {folder}). Fix: resume it with --ckpt_path=last, or start a new run in another directory"
                " with --trainer.default_root_dir=<new dir>; nothing was changed."
            )
        return None
    if ckpt_path == "last":
        candidates = [p for p in existing if p.name.startswith("last")]
        if not candidates:
            return None  # Lightning says there is nothing to resume and starts afresh
        path = candidates[-1]
        if not is_sharded_checkpoint(path) and not is_intact(path):  # a requeued job must not stop on it
            fallback = newest_intact_checkpoint(folder, skip=path)
            if fallback is None:
                raise ConfigurationError(
                    f"--ckpt_path=last: {path} is damaged and {folder} holds no intact checkpoint."
                    " Fix: start a new run without --ckpt_path in another --trainer.default_root_dir."
                )
            notice(
                f"--ckpt_path=last: {path} is damaged (truncated or corrupt); resuming from the newest intact"
                f" checkpoint, {fallback}, instead. The damaged file is left as it is."
            )
            options["ckpt_path"], path = str(fallback), fallback
        return read_checked(path)
    if ckpt_path in SPECIAL_CKPT_PATHS or "://" in str(ckpt_path):
        return None
    if not Path(ckpt_path).exists():
        raise ConfigurationError(
            f"--ckpt_path={ckpt_path} does not exist. Fix: give the path of a .ckpt file, or 'last' / 'best'."
        )
    return read_checked(Path(ckpt_path))


def read_checked(path: Path) -> tuple[Path, dict[str, Any] | None]:
    """A checkpoint file and its contents; a folder of shards is checked whole, and read by the strategy later."""
    if path.is_dir():
        check_sharded_checkpoint(path)
        return path, None
    return path, load_checkpoint(path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint once for the checks: memory-mapped and ``weights_only``, as Lightning reads it."""
    return read_torch_file(path, name=f"--ckpt_path={path}", mmap=True)
