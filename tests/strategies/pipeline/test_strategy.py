"""``multigpu/strategies/pipeline/strategy.py`` without a pipelined run (the GPT example's runs are in
tests/examples/test_gpt_pipeline.py): the strategy takes the settings ``PipelineOptions`` declares, by name, given by
name (``--pipeline.*``) or as a class (its ``init_args``)."""

from __future__ import annotations

import dataclasses

import pytest
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import Strategy

from multigpu.errors import ConfigurationError
from multigpu.strategies.pipeline.options import PipelineOptions
from multigpu.strategies.pipeline.strategy import PipelineStrategy
from tests.helpers import RUNS_COMMAND_GLOBAL, folder_whose_index_runs_code


def test_the_strategy_takes_the_options_settings_by_name():
    strategy = PipelineStrategy(micro_batches=8, schedule="gpipe", data_parallel_size=2)
    assert strategy.options == PipelineOptions(micro_batches=8, schedule="gpipe", data_parallel_size=2)
    assert strategy.stages_per_rank == 1 and strategy.pipeline_size == "auto"
    with pytest.raises(ConfigurationError, match=r"schedule=zigzag is not a pipeline schedule\. Fix: one of gpipe"):
        PipelineStrategy(schedule="zigzag")


def test_a_strategy_given_as_a_class_takes_the_options_settings_as_its_init_args():
    parser = ArgumentParser()
    parser.add_argument("--strategy", type=Strategy)  # as LightningCLI's --trainer.strategy
    arguments = ["--strategy.class_path=multigpu.strategies.PipelineStrategy", "--strategy.init_args.micro_batches=8"]
    config = parser.parse_args(arguments)
    assert {field.name for field in dataclasses.fields(PipelineOptions)} <= set(vars(config.strategy.init_args))
    strategy = parser.instantiate(config).strategy
    assert isinstance(strategy, PipelineStrategy) and strategy.options == PipelineOptions(micro_batches=8)


def test_a_resume_reads_the_folder_checked_and_refuses_one_that_would_run_code(tmp_path):
    """The strategy's own read (each rank's, after the checks before launch): the folder's index is checked before
    torch reads it (multigpu/checkpoints/safe.py; a real pipeline resume: tests/examples/test_gpt_pipeline.py)."""
    folder = folder_whose_index_runs_code(tmp_path / "last.ckpt", tmp_path / "ran")
    with pytest.raises(ConfigurationError, match=f"holds {RUNS_COMMAND_GLOBAL}"):
        PipelineStrategy().load_checkpoint(folder)
    assert not (tmp_path / "ran").exists()
