"""Every private name of Lightning, jsonargparse and torch that the template relies on, in one place.

Each is a small function with a one-line reason; ``tests/test_compat.py`` has a fast test for each that fails
loudly when a library release renames or changes it. Nothing else in ``src/`` reaches into another object's
internals, so an upgrade of Lightning is checked by running that one test file.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Collection, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch import nn

if TYPE_CHECKING:
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

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
    loop._broadcast_sigterm_tensor = lambda: None  # type: ignore[method-assign]
    return True


# -- Lightning: checkpointing, strategies, launchers --------------------------------------------------------


def stop_started_processes(trainer: L.Trainer, signum: signal.Signals = signal.SIGKILL) -> None:
    """Signal the ddp ranks this process started (none where it was started itself): the ``ddp`` launcher's
    class is private (``_SubprocessScriptLauncher``); its ``kill`` is what Lightning itself calls on Ctrl-C."""
    launcher = trainer.strategy.launcher
    if isinstance(launcher, _SubprocessScriptLauncher):
        launcher.kill(signum)


#: ``ModelCheckpoint``'s protected methods that ``RunCheckpoint`` (its subclass) overrides or calls: the one place
#: that decides on the monitored metric, its way of writing ``last``, and the metrics it decides on
MODEL_CHECKPOINT_HOOKS = ("_save_topk_checkpoint", "_save_last_checkpoint", "_monitor_candidates")


def set_mesh_sizes(strategy: Any, data_parallel: int, tensor_parallel: int) -> None:
    """Set a ``ModelParallelStrategy``'s mesh sizes once the world size is known (its ``__init__`` takes them
    before the processes exist, and its ``"auto"`` puts the processes of a node on the tensor-parallel side)."""
    strategy._data_parallel_size = data_parallel
    strategy._tensor_parallel_size = tensor_parallel


def collective_timeout(strategy: Any) -> timedelta | None:
    """How long a ``DDPStrategy``'s or ``ModelParallelStrategy``'s collectives wait: the timeout each creates its
    process group with, which neither exposes publicly (both keep it in ``_timeout``)."""
    return strategy._timeout


# -- jsonargparse and LightningCLI --------------------------------------------------------------------------


def subcommand_parser(cli: LightningCLI, subcommand: str | None) -> LightningArgumentParser:
    """The parser of one subcommand (``fit``, ...), or the only one without subcommands: LightningCLI keeps them in
    its private ``_parser`` (its ``callback_keys`` and ``default_config_files`` are public)."""
    return cli._parser(subcommand)


# -- torch --------------------------------------------------------------------------------------------------


def compiled_by_torch(module: nn.Module) -> bool:
    """Whether ``module.compile()`` compiled the module's call, or its ``forward`` is a ``torch.compile`` result:
    compiling either again would trace a compiled function."""
    forward = module.__dict__.get("forward")
    return module._compiled_call_impl is not None or hasattr(forward, "_torchdynamo_orig_callable")


@contextlib.contextmanager
def only_children(module: nn.Module, names: Collection[str]) -> Iterator[None]:
    """Within the block, ``module`` has only the child modules ``names`` (and its own parameters and buffers).

    ``nn.parallel.replicate`` copies every module below the one it gets; this is how dp copies only the children
    ``forward`` uses. The registry of children (``_modules``) is swapped, not rebuilt, so identities stay.
    """
    children = module._modules
    module._modules = {name: child for name, child in children.items() if name in names or child is None}
    try:
        yield
    finally:
        module._modules = children
