"""The facts of a run (multigpu/facts/__init__.py), derived once from its options: what every later step reads."""

from __future__ import annotations

import os
from pathlib import Path

from jsonargparse import Namespace
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

from multigpu.facts import RunFacts
from multigpu.strategies import DataParallelStrategy, register_strategies


def test_a_strategy_of_auto_that_runs_several_processes_is_named_ddp_so_it_gets_the_templates_ddp_options():
    # the collective timeout and, for manual optimization, find_unused_parameters: options of a ddp strategy by name
    cpu = {"strategy": "auto", "accelerator": "cpu"}
    assert RunFacts.of({**cpu, "devices": 2}).trainer_strategy == "ddp"
    assert RunFacts.of({**cpu, "devices": 1, "num_nodes": 2}).trainer_strategy == "ddp"
    assert RunFacts.of({**cpu, "devices": 1}).trainer_strategy == "auto"  # one process: Lightning's single device
    assert RunFacts.of({**cpu, "devices": "auto"}).trainer_strategy == "auto"  # one CPU process, as Lightning counts
    assert RunFacts.of({**cpu, "strategy": "ddp_spawn", "devices": 2}).trainer_strategy == "ddp_spawn"  # a name is kept


def test_the_processes_are_one_per_device_and_node_where_the_strategy_starts_them_and_one_under_dp():
    facts = RunFacts.of({"strategy": "DDP", "devices": "0,1", "num_nodes": 2, "accelerator": "gpu"})
    assert (facts.accelerator, facts.devices, facts.strategy, facts.processes) == ("cuda", 2, "ddp", 4)
    assert facts.several_cuda_processes
    dp = RunFacts.of({"strategy": "dp", "devices": 4, "accelerator": "gpu"})
    assert (dp.devices, dp.processes, dp.trainer_strategy) == (4, 1, "dp")
    assert not dp.several_cuda_processes  # one process on four GPUs: no process group, no NCCL flight recorder
    on_cpu = RunFacts.of({"strategy": "ddp", "devices": 2, "accelerator": "cpu"})
    assert on_cpu.processes == 2 and not on_cpu.several_cuda_processes
    assert RunFacts.of({"devices": "many", "accelerator": "cpu"}).devices is None  # for the checks to refuse


def test_the_facts_of_a_subcommands_options_name_its_classes_run_directory_and_checkpoint(tmp_path):
    options = Namespace(
        trainer=Namespace(strategy=Namespace(class_path="my.Strategy"), devices=1, default_root_dir=str(tmp_path)),
        model=Namespace(class_path="pkg.Model"),
        data="pkg.Data",
    )
    facts = RunFacts.of(options, "fit")
    assert (facts.subcommand, facts.model_class, facts.data_class) == ("fit", "pkg.Model", "pkg.Data")
    assert facts.strategy is None and facts.trainer_strategy == Namespace(class_path="my.Strategy")  # a class
    assert facts.run_dir == tmp_path and facts.checkpoint is None
    resumed = facts.resuming(tmp_path / "last.ckpt")
    assert resumed.checkpoint == tmp_path / "last.ckpt" and facts.checkpoint is None  # a new object: facts stay
    assert RunFacts.of(Namespace(trainer=Namespace(devices=1))).run_dir == Path.cwd()


def test_the_strategy_class_is_told_from_a_name_a_class_path_or_an_object_and_named_as_given():
    register_strategies()
    assert RunFacts.of({"strategy": "DDP_Spawn"}).strategy_class is DDPStrategy
    assert RunFacts.of({"strategy": "DDP_Spawn"}).strategy_option == "--trainer.strategy=DDP_Spawn"
    assert RunFacts.of({"strategy": "dp"}).strategy_class is DataParallelStrategy  # the engine's, once registered
    path = "lightning.pytorch.strategies.ModelParallelStrategy"
    given = RunFacts.of({"strategy": Namespace(class_path=path)})
    assert given.strategy_class is ModelParallelStrategy
    assert given.strategy_option == f"--trainer.strategy.class_path={path}"
    assert RunFacts.of({"strategy": DDPStrategy()}).strategy_class is DDPStrategy
    assert RunFacts.of({"strategy": "auto", "devices": 2}).strategy_class is None  # Lightning picks it
    assert RunFacts.of({"strategy": "nonesuch"}).strategy_class is None  # for check_strategy to refuse


def test_a_one_process_strategy_is_told_from_its_name():
    assert RunFacts.of({"strategy": "dp"}).one_process_strategy
    assert RunFacts.of({"strategy": "single_device"}).one_process_strategy
    for several in ("auto", "ddp", "fsdp2", "pipeline"):
        assert not RunFacts.of({"strategy": several}).one_process_strategy


def test_the_trainer_options_later_steps_need_are_facts(tmp_path):
    options = Namespace(
        trainer=Namespace(accumulate_grad_batches=4, sync_batchnorm=True, devices="0,1", accelerator="gpu"),
        compile=True,
    )
    facts = RunFacts.of(options, "fit")
    assert (facts.accumulate_grad_batches, facts.compile, facts.sync_batchnorm) == (4, True, True)
    assert (facts.devices_option, facts.accelerator_option) == ("0,1", "gpu")  # as written, for the messages
    plain = RunFacts.of(Namespace(trainer=Namespace(accumulate_grad_batches=None)), "fit")
    assert (plain.accumulate_grad_batches, plain.compile, plain.sync_batchnorm) == (1, False, False)


def test_the_options_later_steps_read_are_facts_of_the_parsed_command_line(tmp_path):
    from tests.cli import CLI
    from tests.conftest import TINY

    cli = CLI(args=[
        *TINY, "--callbacks_off=[throughput]", "--progress_bar=plain", "--batch_size_per_process=true",
        "--collective_timeout=12", "--pipeline.micro_batches=8", "--model.init_args.hidden=8",
        "--data.init_args.batch_size=16", "--trainer.max_time=00:00:05:00", "--trainer.enable_checkpointing=false",
    ], run=False)  # fmt: skip
    facts = cli.facts
    assert (facts.callbacks_off, facts.progress_bar, facts.batch_size_per_process) == ({"throughput"}, "plain", True)
    assert facts.collective_timeout == 12 and facts.pipeline == cli.config.pipeline.as_dict()
    assert facts.pipeline["micro_batches"] == 8
    assert facts.model_init_args["hidden"] == 8 and facts.data_batch_size == 16 and facts.ckpt_path_option is None
    assert facts.max_time == "00:00:05:00" and not facts.lightning_checkpointing
    assert not facts.lightning_model_summary and facts.lightning_progress_bar  # tiny.yaml: enable_model_summary: false
    alone = RunFacts.of({"devices": 1, "barebones": True})  # a trainer mapping alone: the engine's defaults
    assert (alone.callbacks_off, alone.collective_timeout, alone.pipeline) == (set(), None, {})
    assert alone.model_init_args == {} and not alone.lightning_model_summary


def test_the_launch_is_a_fact_of_the_environment_the_facts_are_derived_in(monkeypatch):
    for name in [*os.environ]:
        if name.startswith(("SLURM_", "TORCHELASTIC_")):
            monkeypatch.delenv(name)
    assert RunFacts.of({}).launch.kind == "plain"
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    batch = RunFacts.of({"strategy": "ddp", "devices": 2, "accelerator": "cpu"})
    assert batch.launch.kind == "sbatch"
    monkeypatch.delenv("SLURM_JOB_ID")  # the facts keep the launch they were derived in
    assert batch.launch.kind == "sbatch" and RunFacts.of({}).launch.kind == "plain"
