"""Checks that run before any process starts, so that a bad launch fails in a second, not in a hang.

A wrong device count or a SLURM allocation that does not match ``--trainer.devices`` otherwise shows up as a
process group waiting forever for ranks that never come; these checks turn it into one clear message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.strategies import StrategyRegistry

from src.data.sampling import per_process_batch_size
from src.errors import ConfigurationError

GPU_ACCELERATORS = ("gpu", "cuda")
#: strategies that run one process per device (the world size is devices x num_nodes)
MULTIPROCESS_PREFIXES = ("ddp", "fsdp", "deepspeed")


#: Lightning ignores SLURM in a job with one of these names (``salloc`` names its job ``interactive``)
INTERACTIVE_JOB_NAMES = ("bash", "interactive")
#: SLURM_STEP_ID of steps that srun did not start; the batch script itself has no SLURM_STEP_ID at all (22.05)
NON_SRUN_STEP_IDS = ("batch", "extern", "interactive", "4294967294", "4294967291", "4294967290")


def started_by_srun() -> bool:
    """True in a task that ``srun`` started: SLURM sets ``SLURM_STEP_ID`` there, never in a batch script or an
    ``salloc`` shell (checked on SLURM 22.05: the batch script has ``SLURM_JOB_ID``, ``SLURM_NTASKS`` and even
    ``SLURM_PROCID=0``, but no ``SLURM_STEP_ID``)."""
    step = os.environ.get("SLURM_STEP_ID", os.environ.get("SLURM_STEPID"))
    return "SLURM_JOB_ID" in os.environ and step is not None and step not in NON_SRUN_STEP_IDS


def interactive_job() -> bool:
    """True in a job named ``bash`` or ``interactive``, where Lightning does not take ranks from SLURM."""
    return os.environ.get("SLURM_JOB_NAME") in INTERACTIVE_JOB_NAMES


def launched_by_torchrun() -> bool:
    """True in a process that ``torchrun`` started; Lightning then takes the ranks from torchrun, even in SLURM."""
    return torch.distributed.is_available() and torch.distributed.is_torchelastic_launched()


def in_slurm_step() -> bool:
    """True inside a task that ``srun`` started, in a job where Lightning takes the ranks from SLURM."""
    return "SLURM_NTASKS" in os.environ and started_by_srun() and not interactive_job()


def in_slurm_batch_script() -> bool:
    """True in a SLURM job's batch script, where processes were not started by ``srun``."""
    return "SLURM_JOB_ID" in os.environ and not started_by_srun() and not interactive_job()


def resolve_accelerator(accelerator: Any) -> str:
    """``auto`` -> ``cuda`` or ``cpu``; ``gpu`` -> ``cuda``; other names unchanged."""
    if not isinstance(accelerator, str):
        return "custom"
    accelerator = accelerator.lower()
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if accelerator in GPU_ACCELERATORS else accelerator


def available_devices(accelerator: str) -> int:
    """How many devices of this kind the machine has."""
    if accelerator == "cuda":
        return torch.cuda.device_count()
    if accelerator == "cpu":
        return os.cpu_count() or 1
    return 0


def requested_devices(devices: Any, accelerator: str) -> int | None:
    """Number of devices ``--trainer.devices`` asks for (``None`` when it cannot be told here)."""
    if isinstance(devices, str):
        devices = devices.strip()
        if devices in ("auto", "-1"):
            return 1 if accelerator == "cpu" and devices == "auto" else available_devices(accelerator)
        if "," in devices:
            return len([d for d in devices.split(",") if d.strip()])
        if devices.isdigit():
            devices = int(devices)
        else:
            return None
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, int):
        return available_devices(accelerator) if devices == -1 else devices
    return None


def strategy_name(strategy: Any) -> str | None:
    """The strategy's registry name, or None for a strategy given as a class (from YAML ``class_path``)."""
    return strategy.lower() if isinstance(strategy, str) else None


def world_size(strategy: str | None, devices: int, num_nodes: int) -> int:
    """Processes the run will have."""
    if strategy is None:
        return devices * num_nodes
    if strategy == "auto":
        return devices * num_nodes if devices * num_nodes > 1 else 1
    if strategy.startswith(MULTIPROCESS_PREFIXES):
        return devices * num_nodes
    return 1  # single_device, dp


def check_strategy(strategy: str | None) -> None:
    if strategy is None or strategy == "auto" or strategy in StrategyRegistry:
        return
    names = ", ".join(["auto", *sorted(StrategyRegistry.available_strategies())])
    raise ConfigurationError(
        f"--trainer.strategy={strategy} is not a known strategy. Fix: use one of {names}"
        " (dp, ddp and ddp_spawn are the usual choices; see the strategy guide in the README)."
    )


def check_devices(accelerator: str, devices: int | None, strategy: str | None, num_nodes: int) -> None:
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError(
            "--trainer.accelerator asks for a GPU, but PyTorch sees no CUDA GPU on this machine"
            f" (torch {torch.__version__}, CUDA build: {torch.version.cuda is not None})."
            " Fix: use --trainer.accelerator=cpu (or auto), or run on a GPU machine with a CUDA build of PyTorch."
        )
    if devices is not None:
        have = available_devices(accelerator)
        if devices < 1:
            raise ConfigurationError(f"--trainer.devices must be at least 1 (or -1 / auto for all), got {devices}.")
        if accelerator in ("cuda", "cpu") and devices > have:
            kind = "GPUs" if accelerator == "cuda" else "CPU cores"
            raise ConfigurationError(
                f"--trainer.devices={devices} asks for more {kind} than this machine has ({have})."
                f" Fix: set --trainer.devices to at most {have}"
                + (", or --trainer.accelerator=cpu to simulate processes on the CPU." if accelerator == "cuda" else ".")
            )
    if strategy == "dp" and num_nodes > 1:
        raise ConfigurationError(
            f"--trainer.strategy=dp runs in one process on one machine and cannot span --trainer.num_nodes={num_nodes}."
            " Fix: use --trainer.strategy=ddp across nodes."
        )


def check_slurm(strategy: str | None, devices: int | None, num_nodes: int, processes: int) -> None:
    if launched_by_torchrun():
        return  # e.g. `srun --ntasks-per-node=1 torchrun --nproc_per_node=4 ...`: SLURM's task count is not the ranks
    tasks = int(os.environ.get("SLURM_NTASKS", "1"))
    if in_slurm_batch_script() and processes > 1 and tasks > 1:
        raise ConfigurationError(
            "this runs in a SLURM batch script with several tasks but was not started by srun, so the other ranks"
            " never start and training would hang. Fix: launch it as `srun python -m src.cli ...` (see slurm/)."
        )
    if started_by_srun() and interactive_job() and tasks > 1:
        raise ConfigurationError(
            f"srun started {tasks} tasks in a job named '{os.environ['SLURM_JOB_NAME']}' (salloc's default), and"
            " Lightning ignores SLURM's ranks in such a job: each task would start a run of its own. Fix: name the"
            " job (`salloc -J train ...` or `srun -J train python -m src.cli ...`), or run `python -m src.cli` in the"
            " salloc shell without srun (one node)."
        )
    if not in_slurm_step():
        return
    if strategy is not None and strategy.startswith("ddp_spawn"):
        raise ConfigurationError(
            f"--trainer.strategy={strategy} inside an srun step: srun already started one process per task, and"
            " each would spawn its own workers with ranks SLURM did not assign. Fix: use --trainer.strategy=ddp"
            " (one process per task, ranks from SLURM)."
        )
    # inside a step SLURM_NNODES is the step's node count; SLURM_JOB_NUM_NODES is the allocation's
    nodes = int(os.environ.get("SLURM_NNODES", os.environ.get("SLURM_JOB_NUM_NODES", "1")))
    if devices is not None and (processes != tasks or num_nodes != nodes):
        per_node = tasks // nodes if tasks % nodes == 0 else None
        if per_node is None:
            fix = "an allocation with the same number of tasks on every node"
        else:
            fix = f"--trainer.devices={per_node} --trainer.num_nodes={nodes}"
            if world_size(strategy, 2, 1) == 1:  # a one-process strategy cannot use several tasks
                fix += " --trainer.strategy=ddp"
        raise ConfigurationError(
            f"SLURM started {tasks} task(s) on {nodes} node(s), but --trainer.strategy={strategy or 'auto'}"
            f" --trainer.devices={devices} --trainer.num_nodes={num_nodes} makes {processes} process(es) on"
            f" {num_nodes} node(s), so the process group would never complete. Fix: pass {fix}, or change the job's"
            " --nodes / --ntasks-per-node (and --gres) to match."
        )
    if tasks > 1 and "SLURM_NTASKS_PER_NODE" not in os.environ:
        # Lightning reads the per-node count from this variable and stops with a traceback without it
        raise ConfigurationError(
            f"the SLURM job asked for --ntasks={tasks} without --ntasks-per-node, which Lightning needs to place"
            f" the ranks. Fix: submit with --nodes={nodes} --ntasks-per-node={max(tasks // nodes, 1)} instead of"
            " --ntasks."
        )


def check_batch_size(batch_size: Any, processes: int, accumulate: int) -> None:
    if not isinstance(batch_size, int):
        return
    try:
        per_process_batch_size(batch_size, processes, accumulate)
    except ValueError as error:
        raise ConfigurationError(str(error)) from None


def check_launch(trainer: Mapping[str, Any], batch_size: Any = None) -> None:
    """Check a trainer config (the ``trainer`` section of the CLI config) before anything starts.

    Raises ``ConfigurationError`` with the option to change and how.
    """
    strategy = strategy_name(trainer.get("strategy", "auto"))
    check_strategy(strategy)
    accelerator = resolve_accelerator(trainer.get("accelerator", "auto"))
    num_nodes = int(trainer.get("num_nodes") or 1)
    devices = requested_devices(trainer.get("devices", "auto"), accelerator)
    check_devices(accelerator, devices, strategy, num_nodes)
    processes = world_size(strategy, devices or 1, num_nodes)
    check_slurm(strategy, devices, num_nodes, processes)
    check_batch_size(batch_size, processes, int(trainer.get("accumulate_grad_batches") or 1))
