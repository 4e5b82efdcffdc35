"""How this process was launched and which devices it has and was asked for, known before anything is built."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

GPU_ACCELERATORS = ("gpu", "cuda")
MULTIPROCESS_PREFIXES = ("ddp", "fsdp", "deepspeed", "tensor_parallel", "pipeline")

#: Lightning ignores SLURM in a job with one of these names (``salloc`` names its job ``interactive``)
INTERACTIVE_JOB_NAMES = ("bash", "interactive")
#: SLURM_STEP_ID of steps that srun did not start; the batch script itself has no SLURM_STEP_ID at all (22.05)
NON_SRUN_STEP_IDS = ("batch", "extern", "interactive", "4294967294", "4294967291", "4294967290")


def started_by_srun() -> bool:
    """True in a task that ``srun`` started (a batch script has even ``SLURM_PROCID=0``, but no step id)."""
    step = os.environ.get("SLURM_STEP_ID", os.environ.get("SLURM_STEPID"))
    return "SLURM_JOB_ID" in os.environ and step is not None and step not in NON_SRUN_STEP_IDS


def interactive_job() -> bool:
    return os.environ.get("SLURM_JOB_NAME") in INTERACTIVE_JOB_NAMES


def launched_by_torchrun() -> bool:
    """True in a process that ``torchrun`` started: Lightning then takes the ranks from torchrun, even in SLURM."""
    return torch.distributed.is_available() and torch.distributed.is_torchelastic_launched()


def in_slurm_step() -> bool:
    return "SLURM_NTASKS" in os.environ and started_by_srun() and not interactive_job()


def in_slurm_batch_script() -> bool:
    return "SLURM_JOB_ID" in os.environ and not started_by_srun() and not interactive_job()


def launch_kind() -> str:
    """``torchrun`` (which wins inside SLURM too), ``srun``, ``interactive_srun`` (a job where Lightning ignores
    SLURM), ``sbatch`` (the batch script, not srun) or ``plain``."""
    if launched_by_torchrun():
        return "torchrun"
    if in_slurm_step():
        return "srun"
    if started_by_srun() and interactive_job():
        return "interactive_srun"
    return "sbatch" if in_slurm_batch_script() else "plain"


def ranks_from_slurm() -> bool:
    """Whether Lightning takes the ranks from SLURM: its ``SLURMEnvironment.detect()`` (a task count, in a job not
    named interactive), where torchrun did not start the process (Lightning detects torchrun first)."""
    return "SLURM_NTASKS" in os.environ and not interactive_job() and not launched_by_torchrun()


@dataclass(frozen=True)
class Launch:
    """The launch a process belongs to (``this_launch``): what started it, its rank, and what its ranks share."""

    #: ``launch_kind()``
    kind: str = "plain"
    rank: int = 0
    #: what every rank shares and a requeue keeps (``SLURM job 81``, ``torchrun run x at host:port``)
    job: str | None = None
    step: str | None = None
    #: the restart count of the job
    start: int = 0
    #: the sweep trial this process runs (``<sweep dir> trial 4``)
    trial: str | None = None
    #: whether Lightning takes the ranks from SLURM (``ranks_from_slurm``)
    slurm_ranks: bool = False
    #: the SLURM job's tasks and nodes, where this runs in one
    slurm: SlurmTasks | None = None
    #: whether a launcher other than SLURM or torchrun placed this process among several nodes (``NODE_LAUNCH_ENV``)
    node_launcher: bool = False


@dataclass(frozen=True)
class SlurmTasks:
    """What a SLURM job (or, inside an srun step, the step) asked for."""

    tasks: int = 1
    #: the step's nodes inside a step (``SLURM_NNODES``), else the allocation's
    nodes: int = 1
    #: whether ``--ntasks-per-node`` was given: Lightning places the ranks by it
    tasks_per_node_given: bool = False
    job_name: str | None = None


#: set where another launcher than SLURM or torchrun starts every node's processes (Lightning's own, LSF, MPI, Kubeflow)
NODE_LAUNCH_ENV = ("NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "LSB_JOBID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


#: where a launcher other than srun and torchrun gives a process its rank (Lightning's own launcher, LSF, MPI)
RANK_VARIABLES = (
    "RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "LOCAL_RANK",
    "JSM_NAMESPACE_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
)


def this_launch() -> Launch:
    """The launch this process belongs to, from its launcher's variables."""
    env = os.environ
    sweep, trial = env.get("SWEEP_DIR"), env.get("SWEEP_TRIAL")
    told: dict[str, Any] = {"kind": launch_kind(), "slurm_ranks": ranks_from_slurm()}
    told["node_launcher"] = any(name in env for name in NODE_LAUNCH_ENV)
    if "SLURM_JOB_ID" in env:
        nodes = env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES"))
        told["slurm"] = SlurmTasks(
            tasks=_count(env.get("SLURM_NTASKS")) or 1,
            nodes=_count(nodes) or 1,
            tasks_per_node_given="SLURM_NTASKS_PER_NODE" in env,
            job_name=env.get("SLURM_JOB_NAME"),
        )
    told["trial"] = f"{Path(sweep).resolve()} trial {trial}" if sweep and trial else None
    if launched_by_torchrun():
        job = f"torchrun run {env['TORCHELASTIC_RUN_ID']} at {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
        restart = _count(env.get("TORCHELASTIC_RESTART_COUNT"))
        return Launch(rank=_count(env.get("RANK")), job=job, start=restart, **told)
    if "SLURM_JOB_ID" in env:
        array = env.get("SLURM_ARRAY_JOB_ID")
        job = f"SLURM job {env['SLURM_JOB_ID']}"
        job += f" (array task {array}_{env.get('SLURM_ARRAY_TASK_ID')})" if array else ""
        step = f"step {env.get('SLURM_STEP_ID', env.get('SLURM_STEPID'))}" if started_by_srun() else None
        rank = _count(env.get("SLURM_PROCID")) if step else _launcher_rank()
        return Launch(rank=rank, job=job, step=step, start=_count(env.get("SLURM_RESTART_COUNT")), **told)
    return Launch(rank=_launcher_rank(), **told)


def _launcher_rank() -> int:
    return next((rank for rank in (_count(os.environ.get(name)) for name in RANK_VARIABLES) if rank), 0)


def _count(value: str | None) -> int:
    return int(value) if value is not None and value.strip().isdigit() else 0


def resolve_accelerator(accelerator: Any) -> str:
    """``auto`` -> ``cuda`` or ``cpu``; ``gpu`` -> ``cuda``; other names unchanged."""
    if not isinstance(accelerator, str):
        return "custom"
    accelerator = accelerator.lower()
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if accelerator in GPU_ACCELERATORS else accelerator


def available_devices(accelerator: str) -> int:
    if accelerator == "cuda":
        return torch.cuda.device_count()
    if accelerator == "cpu":
        return os.cpu_count() or 1
    return 0


def requested_devices(devices: Any, accelerator: str) -> int | None:
    """Number of devices ``--trainer.devices`` asks for, or None where it cannot be told here."""
    if isinstance(devices, str):
        devices = devices.strip()
        if devices == "auto":
            return 1 if accelerator == "cpu" else available_devices(accelerator)
        if "," in devices:
            return len([d for d in devices.split(",") if d.strip()])
        devices = int(devices) if devices.lstrip("-").isdigit() else None
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, int):
        return available_devices(accelerator) if devices == -1 else devices
    return None


def world_size(strategy: str | None, devices: int, num_nodes: int) -> int:
    if strategy is None or strategy == "auto" or strategy.startswith(MULTIPROCESS_PREFIXES):
        return devices * num_nodes
    return 1
