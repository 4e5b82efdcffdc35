"""What a run's Trainer is built with and in which order (multigpu/run/trainer.py): the callbacks in the order of
the one
list, held as built through a fit, and ``--callbacks_off``; the options a strategy given by name gets, NCCL's flight
recorder, and the plugins (atomic checkpoints; under SLURM, Lightning's requeue off while ``PreemptionCheckpoint``
handles the signals)."""

from __future__ import annotations

import csv
import inspect
import os
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import torch
from jsonargparse import Namespace
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment
from lightning.pytorch.plugins.io import TorchCheckpointIO

from multigpu.checkpoints.background import BackgroundCheckpointIO
from multigpu.checkpoints.continuation import ExactContinuation
from multigpu.checkpoints.files import AtomicCheckpointIO
from multigpu.facts import RunFacts
from multigpu.facts.environment import this_launch
from multigpu.faults.preemption import PreemptionCheckpoint
from multigpu.observe.run_plan import RunPlan
from multigpu.observe.throughput import SpeedMonitor
from multigpu.run.cli import TemplateCLI, run_cli
from multigpu.run.trainer import CALLBACK_OPTIONS, checkpoint_plugins, run_callbacks, strategy_options
from tests.cli import main
from tests.conftest import TINY


def test_the_trainer_holds_the_callbacks_in_the_order_of_the_one_list_and_nothing_moves_during_a_fit(tmp_path):
    args = [*TINY, "--trainer.enable_model_summary=true", "--progress_bar=plain", "--trainer.max_time=00:00:01:00"]
    cli = TemplateCLI(args=[*args, "--trainer.callbacks+=tests.helpers.Pace"], run=False)
    held = [type(callback).__name__ for callback in cli.trainer.callbacks]
    assert held == [
        "Pace",  # yours first
        "SpeedMonitor",  # before the bar, which shows the interval it measured
        "PlainProgressBar",
        "ModelSummary",
        "EngineLoaders",
        "ExactContinuation",
        "RandomState",
        "RunTimer",
        "PreemptionCheckpoint",
        "StragglerReport",
        "RunPlan",
        "NonFiniteLossGuard",
        "PrecisionBeforeRestore",
        "Float64Metrics",
        "StackDumps",  # before StopOtherRanksOnError: the other ranks' stacks are taken before they are killed
        "StopOtherRanksOnError",
        "UnshareSpawnedTensors",
        "DestroyProcessGroupAtExit",
        "SaveConfigCallback",  # LightningCLI's, which saves config.yaml
        "RunCheckpoint",  # Lightning moves a ModelCheckpoint last
    ]
    run_dir = tmp_path / "run"
    fitted = TemplateCLI(args=["fit", *args, "--trainer.max_steps=2", f"--trainer.default_root_dir={run_dir}"])
    assert [type(callback).__name__ for callback in fitted.trainer.callbacks] == held[1:]  # as built, after the fit


def test_the_facts_of_a_resumed_run_name_its_checkpoint_classes_and_processes(tmp_path):
    run_dir = tmp_path / "run"
    common = ["fit", *TINY, "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={run_dir}"]
    first = TemplateCLI(args=[*common, "--trainer.max_steps=2"])
    assert first.facts.checkpoint is None and first.facts.run_dir == run_dir
    resumed = TemplateCLI(args=[*common, "--trainer.max_steps=3", "--ckpt_path=last"])
    facts = resumed.facts
    assert facts.checkpoint == run_dir / "checkpoints" / "last.ckpt"
    assert (facts.subcommand, facts.accelerator, facts.devices, facts.processes) == ("fit", "cpu", 1, 1)
    assert facts.model_class == "tests.fixtures.workload.TinyClassifier"
    assert facts.data_class == "tests.fixtures.workload.TinyData"
    assert resumed.trainer.global_step == 3  # it resumed from step 2


def test_a_refused_option_is_refused_before_the_run_directory_is_taken_or_anything_built(tmp_path, capsys):
    run_dir = tmp_path / "new"
    try:
        run_cli(["fit", *TINY, "--trainer.devices=0", f"--trainer.default_root_dir={run_dir}"], TemplateCLI)
    except SystemExit as stop:
        assert stop.code == 2
    else:
        raise AssertionError("--trainer.devices=0 was not refused")
    assert "--trainer.devices must be at least 1" in capsys.readouterr().err
    assert not run_dir.exists()  # no lock, no logs, no checkpoints: nothing was taken


def test_a_subclass_hooks_run_where_the_run_puts_them_and_instantiate_classes_is_refused(tmp_path):
    import pytest

    seen: list[str] = []

    class Hooked(TemplateCLI):
        def before_instantiate_classes(self) -> None:
            seen.append(f"before, run directory held: {(self.facts.run_dir / '.run.lock').is_file()}")

        def after_instantiate_classes(self) -> None:
            seen.append(f"after, Trainer of {self.trainer.max_steps} steps")

        def fit(self, **kwargs) -> None:
            seen.append("fit")
            super().fit(**kwargs)

    run_dir = tmp_path / "run"
    cli = Hooked(args=["fit", *TINY, "--trainer.max_steps=2", f"--trainer.default_root_dir={run_dir}"])
    assert seen == ["before, run directory held: True", "after, Trainer of 2 steps", "fit"]
    assert cli.trainer.global_step == 2
    with pytest.raises(TypeError, match="instantiate_classes is never called"):

        class Skipped(TemplateCLI):
            def instantiate_classes(self) -> None: ...


def test_lightningclis_own_steps_run_after_the_run_is_taken_the_checkpoints_options_the_seed_and_the_hooks(tmp_path):
    import torch

    run_dir = tmp_path / "run"
    common = [*TINY, "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={run_dir}"]
    TemplateCLI(args=["fit", *common, "--model.init_args.hidden=8", "--trainer.max_steps=1"])
    seen: list[tuple] = []

    class Hooked(TemplateCLI):
        def before_instantiate_classes(self) -> None:
            options = self.chosen()
            seen.append(("before", options.model.init_args.hidden, options.seed_everything, torch.initial_seed()))

        def before_validate(self) -> None:
            seen.append(("before_validate", self.trainer.validating))

    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    torch.manual_seed(0)
    cli = Hooked(args=["validate", *common, f"--ckpt_path={checkpoint}", "--seed_everything=7"])
    # the checkpoint's model options replaced tiny.yaml's (hidden 32) and the seed was set, before anything was built
    assert seen[0] == ("before", 8, 7, 7)
    assert cli.facts.checkpoint == checkpoint and cli.model.hparams.hidden == 8
    assert cli.model.hparams.get("_instantiator")  # the parsed options kept, for load_from_checkpoint
    assert seen[1:] == [("before_validate", False)]  # LightningCLI's hook around the subcommand, which then ran
    assert cli.trainer.validating is False and cli.trainer.state.fn == "validate"


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
    from multigpu.run.trainer import FLIGHT_RECORDER_NAMES, flight_recorder_defaults

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
    slurm = this_launch().slurm_ranks
    assert slurm  # a task srun started: Lightning takes the ranks from SLURM
    plugins = checkpoint_plugins(None, slurm)
    assert [type(plugin) for plugin in plugins] == [AtomicCheckpointIO, SLURMEnvironment]
    assert plugins[1].auto_requeue is False
    # preemption off: Lightning picks its own SLURM environment, with its save-and-requeue
    assert [type(plugin) for plugin in checkpoint_plugins([], slurm, slurm_requeue=True)] == [AtomicCheckpointIO]
    own = [TorchCheckpointIO(), LightningEnvironment()]
    assert checkpoint_plugins(own, slurm) == own  # the user's checkpoint IO and cluster environment stand
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")  # torchrun inside the SLURM job started the processes
    assert not this_launch().slurm_ranks
    assert [type(plugin) for plugin in checkpoint_plugins(None, this_launch().slurm_ranks)] == [AtomicCheckpointIO]


def test_checkpoints_are_written_in_the_background_unless_switched_off():
    def checkpoint_io(*args: str) -> Any:
        return TemplateCLI(args=[*TINY, *args], run=False).trainer.strategy.checkpoint_io

    assert type(checkpoint_io()) is BackgroundCheckpointIO
    assert type(checkpoint_io("--checkpoint.async_save=false")) is AtomicCheckpointIO
    assert type(checkpoint_io("--callbacks_off=[checkpoint]")) is AtomicCheckpointIO  # a stop's save: synchronous


def test_collective_timeout_reaches_the_ddp_strategy():
    from multigpu.compat import collective_timeout
    from multigpu.run.trainer import COLLECTIVE_TIMEOUT_S

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


def test_a_switched_off_callback_does_not_run(tmp_path):
    run_dir = tmp_path / "run"
    main([
        "fit", *TINY, "--trainer.max_steps=4", "--trainer.log_every_n_steps=2", "--trainer.limit_val_batches=1",
        "--progress_bar=none", "--callbacks_off=[throughput,run_plan]", f"--trainer.default_root_dir={run_dir}",
    ])  # fmt: skip
    rows = list(csv.DictReader((run_dir / "logs" / "version_0" / "metrics.csv").open()))
    assert any(row.get("train/loss") for row in rows)  # the run logged its loss at steps 2 and 4 ...
    assert not [name for name in rows[0] if name.startswith("perf/")]  # ... without the throughput figures
    assert not list(run_dir.rglob("run_plan.json"))
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_the_trainer_holds_the_listed_callbacks_less_those_switched_off():
    def kinds(*args: str) -> set[type]:
        return {type(callback) for callback in TemplateCLI(args=[*TINY, *args], run=False).trainer.callbacks}

    everything = kinds()
    assert {PreemptionCheckpoint, SpeedMonitor, RunPlan, ExactContinuation} <= everything
    fewer = kinds("--callbacks_off=[preemption,throughput]")
    assert everything - fewer == {PreemptionCheckpoint, SpeedMonitor}


def test_an_unknown_name_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        TemplateCLI(args=[*TINY, "--callbacks_off=[thruput]"], run=False)
    assert stop.value.code == 2
    assert "callbacks_off" in capsys.readouterr().err


def test_the_one_list_orders_the_callbacks_with_a_comment_per_line_and_their_switches():
    listed = inspect.getsource(run_callbacks).split("callbacks = [\n")[1].split("\n    ]")[0].splitlines()
    assert len(listed) > 15 and all("  # " in line for line in listed), listed  # each entry says what it is for
    built = Namespace(trainer=Namespace(callbacks=[]))
    for name, callback_class in CALLBACK_OPTIONS.items():
        built[name] = callback_class()
    facts = replace(
        TemplateCLI(args=TINY, run=False).facts,
        callbacks_off=frozenset({"straggler"}),
        progress_bar="plain",
        compile=True,
        max_time="00:00:01:00",
        lightning_model_summary=True,  # the tests' tiny.yaml switches it off
    )
    callbacks, switches, off = run_callbacks(facts, built)
    assert [type(callback).__name__ for callback in callbacks] == [
        "SpeedMonitor", "PlainProgressBar", "ModelSummary", "CompileModel", "EngineLoaders", "ExactContinuation",
        "RandomState", "RunTimer", "PreemptionCheckpoint", "RunPlan", "NonFiniteLossGuard", "RunCheckpoint",
        "PrecisionBeforeRestore", "Float64Metrics", "StackDumps", "StopOtherRanksOnError", "UnshareSpawnedTensors",
        "DestroyProcessGroupAtExit",
    ]  # fmt: skip
    assert switches == {"enable_model_summary": False, "max_time": None}  # Lightning's own replaced
    assert off == {"straggler"}
