"""The run directory: loggers writing into it, one wandb run per directory, and the seed every process shares."""

from __future__ import annotations

import hashlib
import os
import random
import uuid
from pathlib import Path

from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only

UNSET_SAVE_DIRS = (None, "", ".")
WANDB_ID_FILE = "wandb_run_id"


def stable_wandb_id(run_dir: str) -> str:
    """One wandb run per run directory: the id is created once, on rank 0, and read back on every restart."""
    path = Path(run_dir) / WANDB_ID_FILE
    if path.is_file():
        return path.read_text().strip()
    run_id = os.environ.get("WANDB_RUN_ID") or uuid.uuid4().hex[:12]
    if rank_zero_only.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id + "\n")
    return run_id


def shared_random_seed() -> int:
    """The seed ``seed_everything: true`` draws, from the job's id where each process of a launch runs the command."""
    if "PL_GLOBAL_SEED" in os.environ:
        return int(os.environ["PL_GLOBAL_SEED"])
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if job_id != "none":
        return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "little")
    return random.SystemRandom().randrange(2**32)


def place_loggers(trainer: Namespace, run_dir: str | os.PathLike) -> None:
    """Loggers without a ``save_dir`` write into ``run_dir``; a wandb logger continues the directory's wandb run."""
    run_dir = str(run_dir)
    loggers = trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        if not isinstance(logger, Namespace) or "class_path" not in logger:
            continue
        if logger.get("init_args") is None:
            logger["init_args"] = Namespace()
        init_args = logger.init_args
        if init_args.get("save_dir") in UNSET_SAVE_DIRS:
            init_args["save_dir"] = run_dir
        if logger.class_path.endswith("WandbLogger") and init_args.get("id") is None:
            init_args["id"] = stable_wandb_id(run_dir)
