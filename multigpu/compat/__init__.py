"""Every undocumented name of Lightning and torch the engine relies on, each a small function; nothing else reaches
into a library's internals but ``OVERRIDDEN_HOOKS``. ``tests/compat/`` runs each on real objects."""

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

#: the protected hooks a subclass of the engine overrides (``Base._hook``: the subclass, and why)
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


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The Trainer a module is attached to, or None (``module.trainer`` raises)."""
    return module._trainer


def batch_progress(trainer: L.Trainer) -> Any:
    """The training epoch loop's batch counters."""
    return trainer.fit_loop.epoch_loop.batch_progress


def epoch_progress(trainer: L.Trainer) -> Any:
    """The fit loop's epoch counters, which ``FitLoop.on_advance_end`` advances when a fit ends (also mid-epoch)."""
    return trainer.fit_loop.epoch_progress


def reset_batch_position(trainer: L.Trainer) -> None:
    """The epoch's batch counters back to none, as when the next epoch starts (a checkpoint holds its start)."""
    batch_progress(trainer).reset_on_run()


def epoch_loop_restarting(trainer: L.Trainer) -> bool:
    """Whether the epoch loop will continue the resumed epoch (under ``max_steps`` set on every resume)."""
    return bool(trainer.fit_loop.epoch_loop.restarting)


def start_next_epoch_afresh(trainer: L.Trainer) -> None:
    """The epoch loop starts its next epoch with fresh counters, as a run that never stopped."""
    trainer.fit_loop.epoch_loop.restarting = False


def overrides_hook(module: L.LightningModule, hook: str) -> bool:
    """Whether ``module`` implements ``hook``, as Lightning decides it (``is_overridden`` is not exported)."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    return is_overridden(hook, module)


def restarted_mid_epoch(trainer: L.Trainer) -> bool:
    """Whether this fit resumed a checkpoint saved mid-epoch (known from ``on_train_start``)."""
    return bool(trainer.fit_loop.restarted_mid_epoch)


def logging_step(trainer: L.Trainer) -> int:
    """The ``step`` Lightning gives the rows it logs from the current training batch (as LearningRateMonitor)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def set_logging_step(trainer: L.Trainer, step: int) -> None:
    """Set that count, which a checkpoint saves and a resume continues from."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = step


def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the training batch that just ended, by the loop's own decision."""
    loop = trainer.fit_loop.epoch_loop
    return not loop._skip_next_val and bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


def skip_next_validation(trainer: L.Trainer) -> None:
    """Cancel the validation Lightning is about to run after this training batch."""
    trainer.fit_loop.epoch_loop._skip_next_val = True


def skip_per_step_sigterm_broadcast(trainer: L.Trainer) -> bool:
    """Stop the blocking broadcast of Lightning's SIGTERM flag at every ddp step (only its replaced handler sets it)."""
    loop = trainer.fit_loop.epoch_loop
    if not callable(getattr(type(loop), "_broadcast_sigterm_tensor", None)):
        return False
    loop._broadcast_sigterm_tensor = lambda: None
    return True


def registered_strategy(name: str) -> tuple[type[Strategy], dict[str, Any]] | None:
    """The class and arguments ``Trainer(strategy=name)`` builds, or None: the registry's entries are undocumented."""
    if name not in StrategyRegistry:
        return None
    entry = StrategyRegistry[name]
    return entry["strategy"], dict(entry["init_params"])


@contextlib.contextmanager
def registered_with(name: Any, options: dict[str, Any], strategy_class: type | None = None) -> Iterator[None]:
    """``Trainer(strategy=name)`` builds it with ``options`` within: from the registry, it keeps ``64-true``."""
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
    """Take the ddp ranks this process started out of the watch of Lightning's observer, which SIGKILLs this process
    when one exits non-zero; every one released so far."""
    launcher = trainer.strategy.launcher
    if not isinstance(launcher, _SubprocessScriptLauncher):
        return []
    released = launcher.__dict__.setdefault("_multigpu_released", [])
    released.extend(launcher.procs)
    launcher.procs.clear()
    return list(released)


def starts_other_ranks(trainer: L.Trainer) -> bool:
    """Whether this process starts the run's other ranks itself (``ddp`` from one command): a private launcher."""
    launcher = trainer.strategy.launcher
    return (
        isinstance(launcher, _SubprocessScriptLauncher)
        and not launcher.cluster_environment.creates_processes_externally
        and launcher.num_processes > 1
    )


def set_mesh_sizes(strategy: Any, data_parallel: int, tensor_parallel: int) -> None:
    """A ``ModelParallelStrategy``'s mesh sizes, set once the world size is known."""
    strategy._data_parallel_size = data_parallel
    strategy._tensor_parallel_size = tensor_parallel


def set_device_mesh(strategy: Any, mesh: Any) -> None:
    """Give a ``ModelParallelStrategy`` and its LightningModule another device mesh than its 2-D one."""
    strategy._device_mesh = mesh
    strategy.lightning_module._device_mesh = mesh


def collective_timeout(strategy: Any) -> timedelta | None:
    """How long a ``DDPStrategy``'s or ``ModelParallelStrategy``'s collectives wait, which neither exposes; None
    (torch's default) for another strategy."""
    return getattr(strategy, "_timeout", None)


@contextlib.contextmanager
def ranks_join_within(strategy: Any, start: timedelta) -> Iterator[None]:
    """The ranks may take ``start`` to join within, however short the collective timeout."""
    collective = strategy._timeout
    if collective is None or collective >= start or torch.distributed.is_initialized():
        yield
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
    """Lightning's peak FLOP/s of a device at a dtype (``"tfloat32"`` for TF32), or None: a function not exported."""
    from lightning.fabric.utilities.throughput import get_available_flops

    peak = get_available_flops(device, dtype)  # type: ignore[arg-type]
    return float(peak) if peak else None


def pytree_warning_module() -> str:
    """The module pattern of Lightning's private pytree helper, which calls torch's deprecated ``LeafSpec``."""
    return r"lightning\.pytorch\.utilities\._pytree"


def mid_epoch_resume_warning_module() -> str:
    """The module pattern of Lightning's private epoch loop, which warns of a mid-epoch resume of a plain loader."""
    return r"lightning\.pytorch\.loops\.training_epoch_loop"


def optimizer_count(model: L.LightningModule) -> int | None:
    """How many optimizers ``configure_optimizers()`` returns; None where it cannot run before the Trainer exists."""
    from lightning.pytorch.core.optimizer import _configure_optimizers

    try:
        configured = model.configure_optimizers()
        return len(_configure_optimizers(configured)[0]) if configured is not None else None
    except Exception:
        return None


def uses_distributed_sampler(trainer: L.Trainer) -> bool:
    """``Trainer(use_distributed_sampler=...)``, kept on a private connector."""
    return bool(trainer._accelerator_connector.use_distributed_sampler)


def train_loader_source(trainer: L.Trainer) -> Any:
    """What the fit loop asks for its training loaders (data module, model, or loaders given to ``fit``)."""
    return trainer.fit_loop._data_source.instance


def request_train_loaders(trainer: L.Trainer) -> Any:
    """The training loaders, asked for as the fit loop asks: each keeps its arguments for ``loader_arguments``."""
    from lightning.pytorch.trainer.connectors.data_connector import _request_dataloader

    return _request_dataloader(trainer.fit_loop._data_source)


def restart_training_iterator(trainer: L.Trainer) -> None:
    """Make the training iterator again. ``FitLoop.setup_data`` makes it when the loaders are first requested, which an
    early read of ``estimated_stepping_batches`` does before fsdp2 restores a checkpoint's states."""
    fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
    if fetcher is not None and getattr(fetcher, "_combined_loader", None) is not None:
        iter(fetcher)


def drop_saved_loader_states(checkpoint: dict[str, Any]) -> None:
    """Take the training loaders' states (rank 0's only) out of a checkpoint before Lightning restores its loops."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
    loop.pop("combined_loader", None)


def loader_arguments(loader: Any, sampler: Any) -> tuple[tuple, dict[str, Any]]:
    """The arguments ``loader`` was made with, ``sampler`` in place of its own, positional ones by name where known."""
    from lightning.pytorch.utilities.data import _get_dataloader_init_args_and_kwargs

    args, kwargs = _get_dataloader_init_args_and_kwargs(loader, sampler)
    names = getattr(loader, "__pl_saved_arg_names", ())
    if len(names) == len(args):
        return (), {**dict(zip(names, args, strict=True)), **kwargs}
    return args, kwargs


def remade_loader(loader: Any, *args: Any, **kwargs: Any) -> Any:
    """A loader of ``loader``'s class made with these arguments, as Lightning makes one again."""
    from lightning.fabric.utilities.data import _reinstantiate_wrapped_cls

    return _reinstantiate_wrapped_cls(loader, *args, **kwargs)


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
