"""One fast test per function of ``src/compat.py``: each fails when the library changes the private name under it."""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
from datetime import timedelta
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loops.progress import _BatchProgress, _Progress
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from torch import nn

from src import compat
from src.compat import stop_started_processes, subcommand_parser
from src.strategies import DataParallelStrategy

# -- Lightning: the fit loop's counters and switches --------------------------------------------------------


def _trainer(**kwargs: Any) -> L.Trainer:
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, **kwargs)


def test_attached_trainer_is_none_before_fit_and_the_trainer_after():
    module = L.LightningModule()
    assert compat.attached_trainer(module) is None
    trainer = _trainer()
    module.trainer = trainer
    assert compat.attached_trainer(module) is trainer


def test_batch_and_epoch_progress_are_lightnings_counters():
    trainer = _trainer()
    batches, epochs = compat.batch_progress(trainer), compat.epoch_progress(trainer)
    assert isinstance(batches, _BatchProgress) and isinstance(epochs, _Progress)
    for tracker in (batches.current, batches.total, epochs.current, epochs.total):
        assert (tracker.ready, tracker.started, tracker.processed, tracker.completed) == (0, 0, 0, 0)
    assert batches.is_last_batch is False and callable(batches.reset_on_run)


def test_logging_step_is_the_count_lightning_logs_rows_with():
    trainer = _trainer()
    compat.set_logging_step(trainer, 7)
    assert compat.logging_step(trainer) == 7
    # the logger connector writes each row at this count, and the loop saves and restores it
    assert "self.trainer.fit_loop.epoch_loop._batches_that_stepped" in inspect.getsource(_LoggerConnector)
    assert trainer.fit_loop.epoch_loop.on_save_checkpoint()["_batches_that_stepped"] == 7


def test_validation_follows_asks_the_loops_own_decision():
    loop_source = inspect.getsource(_TrainingEpochLoop.advance) + inspect.getsource(_TrainingEpochLoop.on_advance_end)
    assert "self._should_check_val_fx(data_fetcher)" in loop_source
    trainer = _trainer()
    loop = trainer.fit_loop.epoch_loop
    assert loop._skip_next_val is False and hasattr(trainer.fit_loop, "_data_fetcher")
    compat.skip_next_validation(trainer)
    assert loop._skip_next_val is True and compat.validation_follows(trainer) is False


def test_skip_next_validation_sets_the_flag_on_advance_end_reads():
    source = inspect.getsource(_TrainingEpochLoop.on_advance_end)
    assert "if self._skip_next_val:" in source and "should_check_val = False" in source


def test_the_per_step_sigterm_broadcast_is_still_there_to_skip():
    """If this fails, check whether Lightning still runs a blocking collective per step, and update or delete
    ``skip_per_step_sigterm_broadcast``."""
    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(_TrainingEpochLoop.advance)
    trainer = _trainer()
    assert compat.skip_per_step_sigterm_broadcast(trainer)
    assert trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor() is None  # no collective


# -- Lightning: checkpointing, strategies, launchers --------------------------------------------------------


def test_stop_started_processes_kills_the_ranks_the_ddp_launcher_started():
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False, enable_checkpointing=False)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    trainer.strategy.launcher.procs = [rank]  # what the launcher records when it starts rank 1
    stop_started_processes(trainer)
    assert rank.wait(timeout=10) == -signal.SIGKILL
    stop_started_processes(L.Trainer(accelerator="cpu", devices=1, logger=False))  # no launcher: nothing to stop


def test_model_checkpoints_protected_methods_that_run_checkpoint_overrides_are_still_called():
    for name in compat.MODEL_CHECKPOINT_HOOKS:
        assert callable(getattr(ModelCheckpoint, name, None)), name
    assert list(inspect.signature(ModelCheckpoint._save_topk_checkpoint).parameters) == [
        "self", "trainer", "monitor_candidates",
    ]  # fmt: skip
    assert "self._save_topk_checkpoint(trainer, monitor_candidates)" in inspect.getsource(ModelCheckpoint)
    assert "self._save_last_checkpoint(trainer, monitor_candidates)" in inspect.getsource(ModelCheckpoint)


def test_strategy_setup_still_hands_the_model_to_setup_model_which_dp_overrides():
    """``DataParallelStrategy._setup_model`` (its own base class's protected hook) puts the parallel forward on the
    module; it runs only while ``Strategy.setup`` calls the hook after moving the model to the device."""
    source = inspect.getsource(Strategy.setup)
    assert source.index("self.model_to_device()") < source.index("self.model = self._setup_model(self.model)")
    assert "_setup_model" in vars(DataParallelStrategy)


def test_collective_timeout_is_the_timeout_a_strategy_was_built_with():
    from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    for strategy_class in (DDPStrategy, ModelParallelStrategy):
        assert compat.collective_timeout(strategy_class(timeout=timedelta(seconds=12))) == timedelta(seconds=12)
        assert compat.collective_timeout(strategy_class()) == default_pg_timeout


def test_set_mesh_sizes_sets_the_sizes_model_parallel_strategy_keeps():
    from lightning.pytorch.strategies import ModelParallelStrategy

    from src.compat import set_mesh_sizes

    strategy = ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size="auto")
    kept = {name: value for name, value in vars(strategy).items() if value == "auto"}
    assert set(kept) == {"_data_parallel_size", "_tensor_parallel_size"}  # the names the function writes
    set_mesh_sizes(strategy, data_parallel=4, tensor_parallel=1)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (4, 1)


# -- jsonargparse and LightningCLI --------------------------------------------------------------------------


class Parsed(Exception):
    """Raised by the probe below once the arguments are parsed, before anything is built."""


def test_subcommand_parser_is_the_parser_that_read_the_subcommands_options():
    class Probe(LightningCLI):
        def before_instantiate_classes(self) -> None:
            raise Parsed(subcommand_parser(self, self.subcommand), self.parser)

    with pytest.raises(Parsed) as parsed:
        Probe(BoringModel, args=["fit", "--trainer.max_steps=3"])
    fit_parser, main_parser = parsed.value.args
    assert isinstance(fit_parser, LightningArgumentParser) and fit_parser is not main_parser
    assert fit_parser.get_defaults().trainer.max_steps == -1 and "ckpt_path" in fit_parser.get_defaults()
    assert fit_parser.callback_keys == [] and fit_parser.default_config_files == []  # the public attributes used


# -- torch --------------------------------------------------------------------------------------------------


def test_compiled_by_torch_sees_a_compiled_call_and_a_compiled_forward():
    module = nn.Linear(2, 2)
    assert not compat.compiled_by_torch(module)
    module.forward = torch.compile(module.forward, backend="eager")
    assert compat.compiled_by_torch(module)
    other = nn.Linear(2, 2)
    other.compile(backend="eager")
    assert compat.compiled_by_torch(other)


def test_only_children_hides_the_other_children_from_replicate_and_puts_them_back():
    module = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    first = module[0]
    with compat.only_children(module, ["0"]):
        assert [name for name, _ in module.named_children()] == ["0"]
        assert list(module.modules())[1:] == [first]  # what replicate walks and copies
        replica = module._replicate_for_data_parallel()  # how replicate makes each copy: the children it has now
        assert [name for name, _ in replica.named_children()] == ["0"]
    assert [name for name, _ in module.named_children()] == ["0", "1", "2"] and module[0] is first
