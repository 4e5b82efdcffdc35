"""Every name of Lightning and torch that the template relies on and that they do not document as public, in one
place: private attributes and classes, undocumented keys, methods and module paths.

Each is a small function with a one-line reason. Nothing else in the engine or the project reaches into another
library's internals, with one kind of exception: a subclass may override a protected hook of its own base class
(``OVERRIDDEN_HOOKS`` lists them, with the reason). ``tests/compat/`` runs each function and each hook on real objects
(a Trainer and its loops, a strategy, a ``ModelCheckpoint``) and fails when a library release changes the behaviour
relied on; it also scans ``multigpu/`` (``tests/examples/`` scans the project, ``src/``) and fails on a private name
used anywhere else. ``ModelCheckpoint``'s are ``model_checkpoint.py``, torch's ``torch_internals.py`` and the reading
of its distributed-checkpoint index ``checkpoint_index.py``, each re-exported here. An upgrade of a library is
checked by running ``tests/compat/``.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

if TYPE_CHECKING:
    from lightning.pytorch.strategies import Strategy

#: the protected hooks that a subclass in ``src/`` overrides (``Base._hook``: the subclass, and why), each run by
#: ``tests/compat/test_compat.py`` on a real object of the base class
OVERRIDDEN_HOOKS = {
    "ModelCheckpoint._save_topk_checkpoint": "RunCheckpoint: ModelCheckpoint's one place that decides on the monitored"
    " metric, called at every save point; a metric the model does not log is reported there once, not raised",
    "ModelCheckpoint._save_last_checkpoint": "RunCheckpoint: called right after _save_topk_checkpoint when that saved"
    " a checkpoint; skips the last.ckpt that the top-k step just wrote for a metric the model does not log",
    "ModelCheckpoint._save_checkpoint": "RunCheckpoint: the one place ModelCheckpoint writes a file; last.ckpt of the"
    " step and state the top-k file just written holds becomes a second name of that file instead of a second write",
    "Strategy._setup_model": "DataParallelStrategy: the strategy's hook that gets the module after it is on its device;"
    " dp puts its parallel forward on the module there instead of wrapping it",
}

# -- Lightning: the fit loop's counters and switches --------------------------------------------------------


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The Trainer a module is attached to, or None: the public ``module.trainer`` raises when there is none."""
    return module._trainer


def batch_progress(trainer: L.Trainer) -> Any:
    """The training epoch loop's batch counters (``current``/``total`` ready, started, processed, completed)."""
    return trainer.fit_loop.epoch_loop.batch_progress


def epoch_progress(trainer: L.Trainer) -> Any:
    """The fit loop's epoch counters, which ``FitLoop.on_advance_end`` advances when a fit ends (also mid-epoch)."""
    return trainer.fit_loop.epoch_progress


def reset_batch_position(trainer: L.Trainer) -> None:
    """Set the current epoch's batch counters back to none, as Lightning does when the next epoch starts (its
    ``reset_on_run``), so that a checkpoint saved now holds the start of that epoch."""
    batch_progress(trainer).reset_on_run()


def epoch_loop_restarting(trainer: L.Trainer) -> bool:
    """Whether the training epoch loop will continue the epoch of the checkpoint it resumed (its ``restarting``
    switch; under ``max_steps`` Lightning sets it on every resume, also after an epoch that ended)."""
    return bool(trainer.fit_loop.epoch_loop.restarting)


def start_next_epoch_afresh(trainer: L.Trainer) -> None:
    """Turn that switch off: the epoch loop starts its next epoch with fresh counters, as a run that never stopped."""
    trainer.fit_loop.epoch_loop.restarting = False


def overrides_hook(module: L.LightningModule, hook: str) -> bool:
    """Whether ``module`` implements ``hook`` (its class, or the module itself), decided as Lightning decides it (to
    run a validation loop, or to accept a model under ``ModelParallelStrategy``): with its ``is_overridden``, which
    ``lightning.pytorch.utilities`` does not export."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    return is_overridden(hook, module)


def restarted_mid_epoch(trainer: L.Trainer) -> bool:
    """Whether this fit resumed a checkpoint saved in the middle of a training epoch (the fit loop's restart stage,
    known from ``on_train_start``)."""
    return bool(trainer.fit_loop.restarted_mid_epoch)


def logging_step(trainer: L.Trainer) -> int:
    """The ``step`` Lightning gives the rows it logs from the current training batch (as LearningRateMonitor)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def set_logging_step(trainer: L.Trainer, step: int) -> None:
    """Set that count, which a checkpoint saves and a resume continues from."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = step


def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the training batch that just ended (ask in ``on_train_batch_end``).

    Lightning's own decision, so that every ``val_check_interval`` / ``check_val_every_n_epoch`` schedule, the
    last batch of an epoch and iterable datasets are decided as the loop will decide them a moment later.
    """
    loop = trainer.fit_loop.epoch_loop
    return not loop._skip_next_val and bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


def skip_next_validation(trainer: L.Trainer) -> None:
    """Cancel the validation Lightning is about to run after this training batch (the loop's own flag for it)."""
    trainer.fit_loop.epoch_loop._skip_next_val = True


def skip_per_step_sigterm_broadcast(trainer: L.Trainer) -> bool:
    """Stop Lightning broadcasting its SIGTERM flag with a blocking collective on every step under ddp.

    Its flag is set only by Lightning's SIGTERM handler, which ``PreemptionCheckpoint`` replaces, so the
    broadcast (2 to 3 ms with gloo, a host-device sync with NCCL) would send zeros forever. Returns whether the
    method was found and replaced.
    """
    loop = trainer.fit_loop.epoch_loop
    if not callable(getattr(type(loop), "_broadcast_sigterm_tensor", None)):
        return False
    loop._broadcast_sigterm_tensor = lambda: None  # this loop only: its class keeps the method
    return True


# -- Lightning: strategies, launchers, callbacks ---------------------------------------------


def registered_strategy(name: str) -> tuple[type[Strategy], dict[str, Any]] | None:
    """The class and constructor arguments ``Trainer(strategy=name)`` builds (``ddp_spawn``: ``DDPStrategy`` with
    ``start_method="spawn"``), or None for a name not registered: the registry's entries are undocumented dicts."""
    if name not in StrategyRegistry:
        return None
    entry = StrategyRegistry[name]
    return entry["strategy"], dict(entry["init_params"])


@contextlib.contextmanager
def registered_with(name: Any, options: dict[str, Any], strategy_class: type | None = None) -> Iterator[None]:
    """Within the block, ``Trainer(strategy=name)`` builds that strategy with ``options`` too, and as
    ``strategy_class`` where given (a subclass of the registered class). Given by name, a strategy is built from the
    registry, and Lightning checks the precision of a strategy object only (given as one, fsdp2 and tensor_parallel
    would lose ``64-true``); the registry is global, so the entry is put back."""
    if not options:
        yield
        return
    entry = StrategyRegistry[name]
    params = {**entry["init_params"], **options}
    built = strategy_class or entry["strategy"]
    StrategyRegistry.register(name, built, entry["description"], override=True, **params)
    try:
        yield
    finally:
        StrategyRegistry[name] = entry


def release_started_processes(trainer: L.Trainer) -> list[subprocess.Popen]:
    """Take the ddp ranks this process started out of the launcher's watch and return them (none where it was
    started itself). Lightning's observer thread SIGKILLs this process as soon as one of them exits non-zero, which
    is wrong when every rank stops on purpose with the same status, or while this process reports a failure; it
    watches the launcher's ``procs`` list itself, so an empty list ends its watch. Every call returns every process
    released so far."""
    launcher = trainer.strategy.launcher
    if not isinstance(launcher, _SubprocessScriptLauncher):
        return []
    # kept on the launcher: a second call (the stack report, then the callback that stops them) gets them too
    released = launcher.__dict__.setdefault("_multigpu_released", [])
    released.extend(launcher.procs)
    launcher.procs.clear()
    return list(released)


def starts_other_ranks(trainer: L.Trainer) -> bool:
    """Whether this process starts the run's other ranks itself, as Lightning's launcher of ``ddp`` from one command
    does (no srun or torchrun started them): its launcher class is private."""
    launcher = trainer.strategy.launcher
    return (
        isinstance(launcher, _SubprocessScriptLauncher)
        and not launcher.cluster_environment.creates_processes_externally
        and launcher.num_processes > 1
    )


def set_mesh_sizes(strategy: Any, data_parallel: int, tensor_parallel: int) -> None:
    """Set a ``ModelParallelStrategy``'s mesh sizes once the world size is known (its ``__init__`` takes them
    before the processes exist, and its ``"auto"`` puts the processes of a node on the tensor-parallel side)."""
    strategy._data_parallel_size = data_parallel
    strategy._tensor_parallel_size = tensor_parallel


def set_device_mesh(strategy: Any, mesh: Any) -> None:
    """Give a ``ModelParallelStrategy`` and its LightningModule another device mesh than the 2-D one it builds in
    ``setup_environment`` (both keep it in ``_device_mesh``; ``configure_model`` reads ``module.device_mesh``)."""
    strategy._device_mesh = mesh
    strategy.lightning_module._device_mesh = mesh


def collective_timeout(strategy: Any) -> timedelta | None:
    """How long a ``DDPStrategy``'s or ``ModelParallelStrategy``'s collectives wait: the timeout each creates its
    process group with, which neither exposes publicly (both keep it in ``_timeout``)."""
    return strategy._timeout


@contextlib.contextmanager
def ranks_join_within(strategy: Any, start: timedelta) -> Iterator[None]:
    """Within the block (the strategy's ``setup_environment``, which creates the process group), the ranks may take
    up to ``start`` to join, however short the strategy's collective timeout; after it, the default group's
    collectives wait that timeout. ``DDPStrategy`` and ``ModelParallelStrategy`` pass their ``_timeout`` to
    ``init_process_group``, whose rendezvous waits as long as its collectives; torch sets a group's collective
    timeout apart only through ``_set_pg_timeout``."""
    collective = strategy._timeout
    if collective is None or collective >= start or torch.distributed.is_initialized():
        yield  # nothing to widen, or a process group this block does not create
        return
    strategy._timeout = start
    try:
        yield
    finally:
        strategy._timeout = collective
    if torch.distributed.is_initialized():
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(collective)


def available_flops(device: torch.device, dtype: torch.dtype | str) -> float | None:
    """Lightning's table of peak FLOP/s of a device at a dtype (``"tfloat32"`` for TF32), or None where unknown:
    a function of ``lightning.fabric.utilities.throughput`` that the package does not export."""
    from lightning.fabric.utilities.throughput import get_available_flops

    peak = get_available_flops(device, dtype)  # type: ignore[arg-type]
    return float(peak) if peak else None


def pytree_warning_module() -> str:
    """The module (a ``warnings`` filter's pattern) of Lightning's private pytree helper, which calls torch's
    deprecated ``LeafSpec`` check."""
    return r"lightning\.pytorch\.utilities\._pytree"


def mid_epoch_resume_warning_module() -> str:
    """The module (a ``warnings`` filter's pattern) of Lightning's training epoch loop, a private class, which warns
    when a fit resumes mid-epoch with a loader that cannot restore its position."""
    return r"lightning\.pytorch\.loops\.training_epoch_loop"


def optimizer_count(model: L.LightningModule) -> int | None:
    """How many optimizers ``model.configure_optimizers()`` returns, read as Lightning reads its every form (an
    optimizer, a list, a tuple of lists, dicts), through its private ``_configure_optimizers``; None where the
    method cannot run before the Trainer exists (it reads ``self.trainer``) or returns none."""
    from lightning.pytorch.core.optimizer import _configure_optimizers

    try:
        configured = model.configure_optimizers()
        return len(_configure_optimizers(configured)[0]) if configured is not None else None
    except Exception:  # anything the method needs a Trainer for: counted once the Trainer runs it
        return None


# -- Lightning: the training loaders ------------------------------------------------------------------------


def uses_distributed_sampler(trainer: L.Trainer) -> bool:
    """``Trainer(use_distributed_sampler=...)``, which the Trainer keeps on its private accelerator connector."""
    return bool(trainer._accelerator_connector.use_distributed_sampler)


def train_loader_source(trainer: L.Trainer) -> Any:
    """What the fit loop asks for its training loaders: the data module, the model, or loaders given to ``fit``."""
    return trainer.fit_loop._data_source.instance


def request_train_loaders(trainer: L.Trainer) -> Any:
    """The training loaders, asked for as the fit loop asks (``_request_dataloader``): within it, every ``DataLoader``
    made keeps the arguments it was made with, for ``loader_arguments``."""
    from lightning.pytorch.trainer.connectors.data_connector import _request_dataloader

    return _request_dataloader(trainer.fit_loop._data_source)


def drop_saved_loader_states(checkpoint: dict[str, Any]) -> None:
    """Take the training loaders' states out of a checkpoint being resumed, before Lightning restores its loops: the
    fit loop keeps them under a key of its own (``combined_loader``, rank 0's only) and loads them only when its data
    is set up after the restore (not after an early ``estimated_stepping_batches``)."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
    loop.pop("combined_loader", None)


def loader_arguments(loader: Any, sampler: Any) -> tuple[tuple, dict[str, Any]]:
    """The arguments the user made ``loader`` with, ``sampler`` (None for a stream) in place of theirs, as Lightning
    reads them to put its ``DistributedSampler`` in (``_update_dataloader``); positional ones by name where the
    names are known (Lightning records them on the loader), so that a change of one reaches it."""
    from lightning.pytorch.utilities.data import _get_dataloader_init_args_and_kwargs

    args, kwargs = _get_dataloader_init_args_and_kwargs(loader, sampler)
    names = getattr(loader, "__pl_saved_arg_names", ())
    if len(names) == len(args):
        return (), {**dict(zip(names, args, strict=True)), **kwargs}
    return args, kwargs


def remade_loader(loader: Any, *args: Any, **kwargs: Any) -> Any:
    """A loader of ``loader``'s own class made with these arguments, as Lightning makes one again (its attributes set
    after ``__init__`` set again, and an error that names the arguments the class does not take)."""
    from lightning.fabric.utilities.data import _reinstantiate_wrapped_cls

    return _reinstantiate_wrapped_cls(loader, *args, **kwargs)


# -- Lightning: ModelCheckpoint: its own module, for the size of this one -------------------------------------

# -- torch: its own module, for the size of this one ------------------------------------------------------------
# -- torch.distributed.checkpoint: a folder of shards read without running code (its own module, for its size) --
from multigpu.compat.checkpoint_index import (  # noqa: E402
    CHECKPOINT_INDEX_GLOBALS,
    CheckpointIndexUnpickler,
    RefusedGlobal,
    checked_reader,
    index_global_allowed,
    is_checkpoint_index,
    non_tensor_entries,
    read_checkpoint_index,
    read_whole_checkpoint,
    shard_extents,
)
from multigpu.compat.model_checkpoint import (  # noqa: E402
    checkpoint_not_due,
    checkpoint_schedule,
    interval_clock,
    last_checkpoint_written,
    monitor_candidates,
    record_checkpoint_written,
    restart_interval_clock,
    save_last_checkpoint,
    trained_class_path,
    versions_checkpoint_names,
)
from multigpu.compat.torch_internals import (  # noqa: E402
    STAGE_WORK,
    compiled_by_torch,
    draw_loader_base_seed,
    dtensor_of_local,
    only_children,
    scatter_to_devices,
    wrap_stage_work,
)

__all__ = [
    "CHECKPOINT_INDEX_GLOBALS",
    "STAGE_WORK",
    "CheckpointIndexUnpickler",
    "RefusedGlobal",
    "checked_reader",
    "checkpoint_not_due",
    "checkpoint_schedule",
    "compiled_by_torch",
    "draw_loader_base_seed",
    "dtensor_of_local",
    "index_global_allowed",
    "interval_clock",
    "is_checkpoint_index",
    "last_checkpoint_written",
    "monitor_candidates",
    "non_tensor_entries",
    "only_children",
    "read_checkpoint_index",
    "read_whole_checkpoint",
    "record_checkpoint_written",
    "restart_interval_clock",
    "save_last_checkpoint",
    "scatter_to_devices",
    "shard_extents",
    "trained_class_path",
    "versions_checkpoint_names",
    "wrap_stage_work",
]
