"""``src/strategies/pipeline.py`` without a pipelined model (the GPT example's runs are in
tests/examples/test_gpt_pipeline.py): a model without the hooks is refused before launch, the checks of the
sizes, the bubble, tied weights."""

from __future__ import annotations

import pytest
from torch import nn

from src.cli import main
from src.errors import ConfigurationError
from src.strategies.pipeline import PipelineOptions, bubble_fraction, check_pipeline, tied_parameter_names
from tests.conftest import TINY


def test_a_model_without_stages_is_refused_before_launch(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(
            [
                "fit",
                *TINY,
                "--trainer.strategy=pipeline",
                "--trainer.devices=2",
                f"--trainer.default_root_dir={tmp_path}",
            ]
        )
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "TinyClassifier has no pipeline_stage, pipeline_loss. Fix: add pipeline_stage(index, count)" in err
    assert "--trainer.strategy=fsdp2" in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


class Staged(nn.Module):
    def pipeline_stage(self, index: int, count: int) -> nn.Module: ...
    def pipeline_loss(self, output, target): ...
    def model_step(self, batch): ...


@pytest.mark.parametrize(
    ("options", "processes", "batch", "accumulate", "message"),
    [
        (PipelineOptions(micro_batches=3), 4, 12, 1, "micro_batches=3 is fewer than the 4 pipeline stages"),
        (PipelineOptions(micro_batches=4, data_parallel_size=2), 4, 12, 1, "gives 6 samples per data-parallel rank"),
        (PipelineOptions(micro_batches=2), 2, 9, 3, "gives 3 samples per data-parallel rank"),
        (PipelineOptions(tensor_parallel_size=3), 4, 8, 1, "does not divide the 4 processes into pipelines"),
    ],
    ids=["micro-batches", "data-parallel", "accumulation", "sizes"],
)
def test_sizes_that_would_hang_or_mismatch_are_refused(options, processes, batch, accumulate, message):
    with pytest.raises(ConfigurationError, match="Fix:") as refused:
        check_pipeline(options, processes, Staged, batch, accumulate)
    assert message in str(refused.value)
    check_pipeline(PipelineOptions(micro_batches=4, data_parallel_size=2), 4, Staged, 16, 1)  # 2 stages, 4 x 2
    check_pipeline(PipelineOptions(), 2, Staged, None, 1)  # no global batch (a plain loader): the first batch checks


def test_bubble_fraction_is_the_idle_share_of_fill_and_drain():
    assert bubble_fraction(1, 4) == 0
    assert bubble_fraction(2, 2) == pytest.approx(1 / 3) and bubble_fraction(4, 12) == pytest.approx(3 / 15)


def test_a_tied_weight_is_found_under_both_names():
    net = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    assert tied_parameter_names(net) == []
    net[1].weight = net[0].weight
    assert tied_parameter_names(net) == [("0.weight", "1.weight")]
