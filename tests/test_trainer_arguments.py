"""What the template adds to the Trainer (multigpu/trainer_arguments.py), decided from the options before the Trainer is
built: the options a strategy given by name gets, NCCL's flight recorder, and the plugins
(atomic checkpoints; under SLURM, Lightning's requeue off while ``PreemptionCheckpoint`` handles the signals)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest
import torch
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment
from lightning.pytorch.plugins.io import TorchCheckpointIO

from multigpu.checkpoints.background import BackgroundCheckpointIO
from multigpu.checkpoints.files import AtomicCheckpointIO
from multigpu.facts import RunFacts
from multigpu.trainer_arguments import checkpoint_plugins, strategy_options
from tests.cli import TemplateCLI
from tests.conftest import TINY


def test_a_model_that_optimizes_by_hand_gets_find_unused_parameters_under_a_ddp_strategy_by_name():
    from tests.zoo.gan import TinyGAN

    minute = timedelta(seconds=60)
    assert strategy_options("ddp", 60, TinyGAN()) == {"timeout": minute, "find_unused_parameters": True}
    assert strategy_options("ddp_find_unused_parameters_false", 60, TinyGAN()) == {"timeout": minute}  # as named
    assert strategy_options("fsdp2", None, TinyGAN()) == {}  # ddp's option only; null: no timeout
    assert strategy_options("dp", 60, TinyGAN()) == {}  # one process: no collectives


def test_find_unused_parameters_is_on_only_for_a_model_that_steps_several_optimizers_by_hand():
    from tests.zoo.loaders import StreamRegressor

    class OneOptimizerByHand(StreamRegressor):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

    class AsksForTheTrainer(OneOptimizerByHand):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1 / self.trainer.estimated_stepping_batches)

    assert "find_unused_parameters" not in strategy_options("ddp", 60, OneOptimizerByHand())  # every weight a gradient
    assert "find_unused_parameters" not in strategy_options("ddp", 60, StreamRegressor())  # automatic optimization
    assert strategy_options("ddp", None, AsksForTheTrainer()) == {"find_unused_parameters": True}  # cannot tell yet


def test_nccls_flight_recorder_is_on_for_several_cuda_processes_only_and_a_users_setting_wins(tmp_path, monkeypatch):
    from multigpu.trainer_arguments import FLIGHT_RECORDER_NAMES, flight_recorder_defaults

    for name in {*FLIGHT_RECORDER_NAMES, *FLIGHT_RECORDER_NAMES.values()}:
        # set first, so that monkeypatch removes what the function sets: left in this worker's environment, it
        # would start every later command of the worker fresh (tests/prewarmed.py)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)

    def facts(**trainer: Any) -> RunFacts:
        return RunFacts.of({**trainer, "default_root_dir": str(tmp_path)})

    assert flight_recorder_defaults(facts(accelerator="cpu", devices=2)) == {}
    assert flight_recorder_defaults(facts(accelerator="gpu", devices=1, num_nodes=1)) == {}
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")  # the older name of the buffer's size, set by the user
    chosen = flight_recorder_defaults(facts(accelerator="gpu", devices=2))
    folder = tmp_path / "stacks" / "nccl"
    assert chosen == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": f"{folder}/nccl_trace_rank_"}
    assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and "TORCH_FR_BUFFER_SIZE" not in os.environ
    assert folder.is_dir()


@pytest.fixture
def under_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of one task started by ``srun`` (what Lightning detects SLURM by)."""
    for name, value in {
        "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "node1", "SLURM_NTASKS_PER_NODE": "1",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)


def test_under_slurm_lightnings_requeue_is_off_while_preemption_handles_signals(under_slurm):
    def environment(*args: str) -> SLURMEnvironment:
        cli = TemplateCLI(args=[*TINY, "--trainer.strategy=ddp", *args], run=False)
        return cli.trainer.strategy.cluster_environment

    assert environment().auto_requeue is False
    assert environment("--callbacks_off=[preemption]").auto_requeue is True  # Lightning's own handling instead


def test_checkpoints_are_saved_atomically_and_slurms_environment_comes_without_lightnings_requeue(
    under_slurm, monkeypatch
):
    plugins = checkpoint_plugins(None)
    assert [type(plugin) for plugin in plugins] == [AtomicCheckpointIO, SLURMEnvironment]
    assert plugins[1].auto_requeue is False
    # preemption off: Lightning picks its own SLURM environment, with its save-and-requeue
    assert [type(plugin) for plugin in checkpoint_plugins([], slurm_requeue=True)] == [AtomicCheckpointIO]
    own = [TorchCheckpointIO(), LightningEnvironment()]
    assert checkpoint_plugins(own) == own  # the user's checkpoint IO and cluster environment stand
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")  # torchrun inside the SLURM job started the processes
    assert [type(plugin) for plugin in checkpoint_plugins(None)] == [AtomicCheckpointIO]


def test_checkpoints_are_written_in_the_background_unless_switched_off():
    def checkpoint_io(*args: str) -> Any:
        return TemplateCLI(args=[*TINY, *args], run=False).trainer.strategy.checkpoint_io

    assert type(checkpoint_io()) is BackgroundCheckpointIO
    assert type(checkpoint_io("--checkpoint.async_save=false")) is AtomicCheckpointIO
    assert type(checkpoint_io("--callbacks_off=[checkpoint]")) is AtomicCheckpointIO  # a stop's save: synchronous


def test_collective_timeout_reaches_the_ddp_strategy():
    from multigpu.compat import collective_timeout
    from multigpu.trainer_arguments import COLLECTIVE_TIMEOUT_S

    args = ["--trainer.accelerator=cpu", "--trainer.strategy=ddp_spawn", "--trainer.devices=2"]
    cli = TemplateCLI(args=[*TINY, *args, "--collective_timeout=42"], run=False)
    assert collective_timeout(cli.trainer.strategy).total_seconds() == 42
    assert cli.trainer.strategy._start_method == "spawn" and cli.trainer.world_size == 2
    cli = TemplateCLI(args=[*TINY, *args], run=False)
    assert collective_timeout(cli.trainer.strategy).total_seconds() == COLLECTIVE_TIMEOUT_S


@pytest.mark.parametrize("strategy", ["fsdp2", "tensor_parallel", "auto"])
def test_collective_timeout_reaches_the_model_parallel_strategies_and_auto(strategy):
    from multigpu.compat import collective_timeout

    args = ["--trainer.accelerator=cpu", f"--trainer.strategy={strategy}", "--trainer.devices=2"]
    cli = TemplateCLI(args=[*TINY, *args, "--trainer.precision=64-true", "--collective_timeout=42"], run=False)
    assert collective_timeout(cli.trainer.strategy).total_seconds() == 42 and cli.trainer.world_size == 2
