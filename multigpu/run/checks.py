"""Checks before any process starts, so that a bad launch fails in a second, not as a process group waiting forever.
They take nothing and write nothing."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, StrategyRegistry

from multigpu.command import prog
from multigpu.compat import trained_class_path
from multigpu.data.base import GlobalBatchDataModule
from multigpu.data.sampling import per_process_batch_size
from multigpu.errors import DEBUG_ENV, ConfigurationError, describe
from multigpu.facts import RunFacts
from multigpu.facts.argv import given_as, import_class, option_origin, trainer_section, yaml_value
from multigpu.facts.environment import SlurmTasks, available_devices
from multigpu.hooks.readers import check_datamodule
from multigpu.observe.run_plan import batch_norm_layers
from multigpu.strategies.compile import compile_refusal
from multigpu.strategies.pipeline import PipelineOptions, PipelineStrategy, check_pipeline, check_stages


def check_strategy(strategy: str | None) -> None:
    if strategy is None or strategy == "auto" or strategy in StrategyRegistry:
        return
    names = ", ".join(["auto", *sorted(StrategyRegistry.available_strategies())])
    raise ConfigurationError(
        f"--trainer.strategy={strategy} is not a known strategy. Fix: use one of {names}"
        " (dp, ddp and ddp_spawn are the usual choices; see the engine's docs/strategies.md)."
    )


def check_devices(facts: RunFacts, args: Sequence[Any] | None = None) -> None:
    accelerator, devices, strategy = facts.accelerator, facts.devices, facts.strategy
    if accelerator == "cuda" and not torch.cuda.is_available():
        preset, _ = option_origin(args, "accelerator")
        values = trainer_section(preset) if preset is not None else {}
        also = " and ".join(f"{key}: {yaml_value(values[key])}" for key in ("devices", "strategy") if key in values)
        fix = (
            f"leave out --config {preset} to train on the CPU (configs/trainer/ddp_cpu.yaml rehearses ddp with two"
            " CPU processes)"
            if preset is not None
            else "use --trainer.accelerator=cpu (or auto)"
        )
        raise ConfigurationError(
            f"{given_as(args, 'accelerator', facts.accelerator_option, f'with {also}' if also else '')} asks"
            f" for a GPU, but PyTorch sees no CUDA GPU on this machine (torch {torch.__version__}, CUDA build:"
            f" {torch.version.cuda is not None}). Fix: {fix}, or run on a GPU machine with a CUDA build of PyTorch."
        )
    raw = facts.devices_option
    gpu_only = raw in (-1, "-1") or isinstance(raw, (list, tuple)) or (isinstance(raw, str) and "," in raw)
    if accelerator == "cpu" and gpu_only:
        # Lightning accepts only a count of processes on the CPU and fails with a bare TypeError otherwise
        what = "all GPUs" if raw in (-1, "-1") else "a list of GPU indices"
        on_cpu = f"--trainer.accelerator={facts.accelerator_option}"
        on_cpu += ", and this machine has no GPU" if "auto" in on_cpu else ""
        preset, _ = option_origin(args, "devices")
        count = 1 if strategy in (None, "auto") or facts.one_process_strategy else 2
        fix = f"--trainer.devices={count}" + (f" after --config {preset}" if preset is not None else "")
        why = "two CPU processes, as configs/trainer/ddp_cpu.yaml" if count == 2 else "one CPU process"
        why += "; dp on the CPU runs as one device" if strategy == "dp" else ""
        raise ConfigurationError(
            f"{given_as(args, 'devices', raw)} means {what}, but the run is on the CPU ({on_cpu}), where"
            f" --trainer.devices is a number of processes. Fix: pass {fix} ({why})"
            + (f", or leave out --config {preset}." if preset is not None else ".")
        )
    if devices is not None:
        have = available_devices(accelerator)
        if devices < 1:
            raise ConfigurationError(
                f"--trainer.devices must be at least 1 (or -1 / auto for all), got {devices}."
                " Fix: e.g. --trainer.devices=1, or --trainer.devices=auto for every device of the machine."
            )
        if accelerator in ("cuda", "cpu") and devices > have:
            kind = "GPUs" if accelerator == "cuda" else "CPU cores"
            raise ConfigurationError(
                f"{given_as(args, 'devices', raw)} asks for more {kind} than this machine"
                f" has ({have}). Fix: set --trainer.devices to at most {have}"
                + (", or --trainer.accelerator=cpu to simulate processes on the CPU." if accelerator == "cuda" else ".")
            )
    if strategy == "dp" and facts.num_nodes > 1:
        raise ConfigurationError(
            "--trainer.strategy=dp runs in one process on one machine and cannot span"
            f" --trainer.num_nodes={facts.num_nodes}."
            " Fix: use --trainer.strategy=ddp across nodes."
        )


def check_nodes(facts: RunFacts, args: Sequence[Any] | None = None) -> None:
    """Several nodes need a launch on each; a plain launch on one machine would wait for the others forever."""
    if facts.num_nodes <= 1 or facts.launch.kind in ("srun", "torchrun"):
        return
    if facts.launch.node_launcher:
        return
    raise ConfigurationError(
        f"{given_as(args, 'num_nodes', facts.num_nodes)} needs the command started on every node (srun in a SLURM job,"
        " torchrun, or NODE_RANK and MASTER_ADDR set on each node), but this is a plain launch on one machine: its"
        " processes would wait forever for the other nodes'. Fix: submit slurm/multi_node.sbatch (it sets the"
        " numbers from the allocation; see the engine's slurm/README.md), or pass --trainer.num_nodes=1 to train on"
        " this machine."
    )


def check_slurm(facts: RunFacts) -> None:
    # under torchrun (`srun --ntasks-per-node=1 torchrun --nproc_per_node=4 ...`) SLURM's task count is not the ranks
    strategy, devices, num_nodes, processes = facts.strategy, facts.devices, facts.num_nodes, facts.processes
    slurm = facts.launch.slurm or SlurmTasks()
    tasks = slurm.tasks
    if facts.launch.kind == "sbatch" and processes > 1 and tasks > 1:
        raise ConfigurationError(
            "this runs in a SLURM batch script with several tasks but was not started by srun, so the other ranks"
            f" never start and training would hang. Fix: launch it as `srun {prog()} ...` (see slurm/)."
        )
    if facts.launch.kind == "interactive_srun" and tasks > 1:
        raise ConfigurationError(
            f"srun started {tasks} tasks in a job named '{slurm.job_name}' (salloc's default), and"
            " Lightning ignores SLURM's ranks in such a job: each task would start a run of its own. Fix: name the"
            f" job (`salloc -J train ...` or `srun -J train {prog()} ...`), or run `{prog()}` in the"
            " salloc shell without srun (one node)."
        )
    if facts.launch.kind != "srun":
        return
    if strategy is not None and strategy.startswith("ddp_spawn"):
        raise ConfigurationError(
            f"--trainer.strategy={strategy} inside an srun step: srun already started one process per task, and"
            " each would spawn its own workers with ranks SLURM did not assign. Fix: use --trainer.strategy=ddp"
            " (one process per task, ranks from SLURM)."
        )
    nodes = slurm.nodes
    if devices is not None and (processes != tasks or num_nodes != nodes):
        per_node = tasks // nodes if tasks % nodes == 0 else None
        if per_node is None:
            fix = "an allocation with the same number of tasks on every node"
        else:
            fix = f"--trainer.devices={per_node} --trainer.num_nodes={nodes}"
            if facts.one_process_strategy:
                fix += " --trainer.strategy=ddp"
        raise ConfigurationError(
            f"SLURM started {tasks} task(s) on {nodes} node(s), but --trainer.strategy={strategy or 'auto'}"
            f" --trainer.devices={devices} --trainer.num_nodes={num_nodes} makes {processes} process(es) on"
            f" {num_nodes} node(s), so the process group would never complete. Fix: pass {fix}, or change the job's"
            " --nodes / --ntasks-per-node (and --gres) to match."
        )
    if tasks > 1 and not slurm.tasks_per_node_given:
        # Lightning reads the per-node count from this variable and stops with a traceback without it
        raise ConfigurationError(
            f"the SLURM job asked for --ntasks={tasks} without --ntasks-per-node, which Lightning needs to place"
            f" the ranks. Fix: submit with --nodes={nodes} --ntasks-per-node={max(tasks // nodes, 1)} instead of"
            " --ntasks."
        )


def check_run_dir(run_dir: Any) -> None:
    """The run directory must be a folder, or a path where one can be made."""
    if not isinstance(run_dir, (str, os.PathLike)) or str(run_dir) in ("", "."):
        return
    path = Path(run_dir)
    blocking = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise ConfigurationError(
            f"--trainer.default_root_dir={run_dir}: {blocking} is a file, not a folder, so the run has nowhere to"
            " write its checkpoints and logs. Fix: pass the path of a folder (new or existing), e.g."
            f" --trainer.default_root_dir={path.with_name(path.name + '_run')}; the file is left as it is."
        )
    if blocking is not None and not os.access(blocking, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"--trainer.default_root_dir={run_dir}: {blocking} is not writable by this user, so the run cannot"
            " save checkpoints or logs. Fix: pass a folder you can write to."
        )


def check_launch(facts: RunFacts, batch_size: Any = None, args: Sequence[Any] | None = None) -> None:
    """Check the launch the run's ``facts`` ask for; ``args`` let a message name the ``--config`` that set a value."""
    check_strategy(facts.strategy)
    check_devices(facts, args)
    if facts.launch.kind != "torchrun":
        check_slurm(facts)
    check_nodes(facts, args)
    if isinstance(batch_size, int):
        try:
            per_process_batch_size(batch_size, facts.processes, facts.accumulate_grad_batches)
        except ValueError as error:
            raise ConfigurationError(str(error)) from None
    check_run_dir(facts.run_dir)


def check_compile(facts: RunFacts) -> None:
    """``--compile=true`` only under the strategies it supports, refused here rather than by every process."""
    kind = facts.strategy_class
    refusal = compile_refusal(kind, facts.strategy_option) if kind is not None else None
    if refusal is not None:
        raise ConfigurationError(refusal)


def check_optimizer(model: Any) -> None:
    """Build the model's optimizer and scheduler on a stand-in parameter: a bad option fails now, not on every rank."""
    optimizer_factory = getattr(model, "optimizer_factory", None)
    if not callable(optimizer_factory):
        return
    stand_in = torch.nn.Parameter(torch.zeros(1))
    try:
        optimizer = optimizer_factory([stand_in])
    except Exception as error:
        raise ConfigurationError(
            f"--model.init_args.optimizer cannot build the optimizer: {describe(error)}. Fix: correct its"
            f" init_args (e.g. --model.init_args.optimizer.init_args.lr=3e-4); `{prog()} fit --model.help"
            f" CLASS` lists the options; set {DEBUG_ENV}=true to see the traceback."
        ) from error
    scheduler_factory = getattr(model, "lr_scheduler_factory", None)
    if not callable(scheduler_factory):
        return
    try:
        scheduler_factory(optimizer)
    except Exception as error:
        raise ConfigurationError(
            f"--model.init_args.lr_scheduler cannot build the LR scheduler: {describe(error)}. Fix: correct its"
            " init_args (e.g. --model.init_args.lr_scheduler.init_args.T_max=1000) or leave it unset for a"
            f" constant learning rate; set {DEBUG_ENV}=true to see the traceback."
        ) from error


def check_checkpoint_model(checkpoint: Mapping[str, Any], path: Path, model_class_path: Any) -> None:
    """The checkpoint must hold the configured model class, else its hyperparameters silently replace ``--model``."""
    hparams = checkpoint.get("hyper_parameters") or {}
    trained = trained_class_path(hparams) if isinstance(hparams, Mapping) else None
    if trained is None or not isinstance(model_class_path, str) or trained == model_class_path:
        return
    if import_class(trained) is not None and import_class(trained) is import_class(model_class_path):
        return  # one class by two paths (``pkg.Model`` re-exported from ``pkg.module.Model``)
    raise ConfigurationError(
        f"--ckpt_path={path} holds a {trained}, but the config builds a {model_class_path} (--model)."
        f" Fix: pass the config the checkpoint was trained with (its run directory keeps it in"
        f" logs/version_*/config.yaml: --config that file), or --model={trained}, or a checkpoint of"
        f" {model_class_path}."
    )


def check_model_flags(args: Any, init_args: Mapping[str, Any], checkpoint: Mapping[str, Any], path: Path) -> None:
    """Refuse a ``--model.*`` flag that differs from the checkpoint's hyperparameters: it would be silently dropped."""
    if not isinstance(args, (list, tuple)):
        return
    hparams = checkpoint.get("hyper_parameters") or {}
    for flag in [str(a).split("=", 1)[0] for a in args if str(a).startswith("--model.")]:
        name = flag.removeprefix("--model.").removeprefix("init_args.").split(".")[0]
        if name not in hparams or name not in init_args:
            continue
        given, saved = _plain(init_args[name]), _plain(hparams[name])
        if given != saved:
            raise ConfigurationError(
                f"{flag}={given} differs from the checkpoint it resumes, {path}, which was trained with"
                f" {name}={saved}; the model is rebuilt from the checkpoint's hyperparameters, so the flag would be"
                f" ignored. Fix: drop {flag} to continue the checkpoint's model, or train a new model at {given}"
                " without --ckpt_path in another --trainer.default_root_dir. Nothing was changed."
            )


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def check_checkpoint_fits(model: Any, checkpoint: Mapping[str, Any], path: Path) -> None:
    """The checkpoint's weights must have the model's names and shapes."""
    saved = checkpoint.get("state_dict")
    if not getattr(model, "strict_loading", True) or not isinstance(saved, Mapping):
        return
    expected = model.state_dict()
    missing = [name for name in expected if name not in saved]
    unexpected = [name for name in saved if name not in expected]
    reshaped = [
        f"{name} is {tuple(saved[name].shape)} there, {tuple(expected[name].shape)} here"
        for name in expected
        if name in saved and hasattr(saved[name], "shape") and tuple(saved[name].shape) != tuple(expected[name].shape)
    ]
    if not (missing or unexpected or reshaped):
        return
    examples = [f"{len(missing)} tensors missing (e.g. {missing[0]})"] if missing else []
    examples += [f"{len(unexpected)} unexpected (e.g. {unexpected[0]})"] if unexpected else []
    examples += [f"{len(reshaped)} of another shape (e.g. {reshaped[0]})"] if reshaped else []
    hparams = checkpoint.get("hyper_parameters") or {}
    trained = trained_class_path(hparams) if isinstance(hparams, Mapping) else None
    raise ConfigurationError(
        f"--ckpt_path={path} holds the weights of another model than the one configured"
        f" ({type(model).__name__}{f', the checkpoint is a {trained}' if trained else ''}): "
        + "; ".join(examples)
        + ". Fix: pass the --model options it was trained with (its run directory keeps them in"
        " logs/version_*/config.yaml, usable as --config), or a checkpoint of this model."
    )


def check_sync_batchnorm(model: torch.nn.Module, trainer: Any, sync_batchnorm: bool) -> None:
    """``--trainer.sync_batchnorm=true``: DDP refuses it on CPU processes, and Lightning ignores it under ``dp``."""
    layers = batch_norm_layers(model) if sync_batchnorm else []
    if not layers:
        return
    example = f"{len(layers)} BatchNorm layer(s), e.g. {layers[0] or type(model).__name__}"
    strategy = trainer.strategy
    if isinstance(strategy, (DDPStrategy, FSDPStrategy)) and strategy.root_device.type == "cpu":
        raise ConfigurationError(
            f"--trainer.sync_batchnorm=true cannot run on CPU processes: torch's SyncBatchNorm needs GPUs, and"
            f" {type(model).__name__} has {example}. Fix: drop --trainer.sync_batchnorm to rehearse on the CPU (each"
            " process then normalises its own part of the batch, which the run plan reports), train in one CPU"
            " process (--trainer.devices=1), whose statistics cover the whole batch, or run on GPUs."
        )
    if getattr(strategy, "parallel_forward_active", False):
        raise ConfigurationError(
            f"--trainer.sync_batchnorm=true has no effect under --trainer.strategy=dp: it synchronises processes and dp"
            f" is one process, whose {example} normalise each GPU's chunk of the batch. Fix: use"
            " --trainer.strategy=ddp with --trainer.sync_batchnorm=true for statistics over the whole batch, or drop"
            " --trainer.sync_batchnorm."
        )


def configured_global_batch(facts: RunFacts) -> int | None:
    """``--data.init_args.batch_size`` where the data module promises a global batch (``GlobalBatchDataModule``)."""
    data_class = import_class(facts.data_class) if facts.data_class is not None else None
    if data_class is None or not issubclass(data_class, GlobalBatchDataModule):
        return None
    return facts.data_batch_size


def check_before_launch(facts: RunFacts, args: Sequence[Any] | None) -> None:
    """Every check of a run's facts before anything is taken, read or built; ``args`` for the messages."""
    batch_size = configured_global_batch(facts)
    check_launch(facts, batch_size=batch_size, args=args)
    if facts.compile:  # before the strategy's own checks: what it refuses is the strategy itself
        check_compile(facts)
    if facts.strategy == PipelineStrategy.strategy_name:
        model = import_class(str(facts.model_class))
        options = PipelineOptions(**facts.pipeline)
        check_pipeline(options, facts.processes, model, batch_size, facts.accumulate_grad_batches)


def check_resumed(
    resumed: tuple[Path, dict[str, Any] | None] | None, facts: RunFacts, args: Sequence[Any] | None
) -> None:
    """The ``--ckpt_path`` checkpoint against the configured model class and ``--model`` options."""
    if resumed is not None and resumed[1] is not None:
        check_checkpoint_model(resumed[1], resumed[0], facts.model_class)
        check_model_flags(args, facts.model_init_args, resumed[1], resumed[0])


def check_built(facts: RunFacts, model: Any, datamodule: Any, trainer: Any, resumed: tuple[Path, Any] | None) -> None:
    """Every check of the built objects before the subcommand runs (Lightning converts BatchNorm for fit only)."""
    check_optimizer(model)
    check_datamodule(model, datamodule)
    if isinstance(trainer.strategy, PipelineStrategy):
        check_stages(model, trainer.strategy.stage_count)
    if facts.subcommand == "fit":
        check_sync_batchnorm(model, trainer, facts.sync_batchnorm)
    if resumed is not None and resumed[1] is not None:
        check_checkpoint_fits(model, resumed[1], resumed[0])
