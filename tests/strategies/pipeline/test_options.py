"""``multigpu/strategies/pipeline/options.py``: a model without the hooks is refused before launch, the checks of
the sizes and schedules, the checks of a model's stages, the bubble (the GPT example's runs are in
tests/examples/test_gpt_pipeline.py)."""

from __future__ import annotations

import pytest
from torch import nn

from multigpu.errors import ConfigurationError
from multigpu.strategies.pipeline.options import PipelineOptions, bubble_fraction, check_pipeline, check_stages
from tests.cli import main
from tests.conftest import TINY
from tests.strategies.pipeline.conftest import Chain


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


INTERLEAVED = {"schedule": "interleaved_1f1b", "stages_per_rank": 2}


@pytest.mark.parametrize(
    ("options", "processes", "batch", "accumulate", "message"),
    [
        (PipelineOptions(micro_batches=3), 4, 12, 1, "micro_batches=3 is fewer than the 4 pipeline stages"),
        (PipelineOptions(micro_batches=4, data_parallel_size=2), 4, 12, 1, "gives 6 samples per data-parallel rank"),
        (PipelineOptions(micro_batches=2), 2, 9, 3, "gives 3 samples per data-parallel rank"),
        (PipelineOptions(tensor_parallel_size=3), 4, 8, 1, "does not divide the 4 processes into pipelines"),
        (PipelineOptions(micro_batches=0), 2, 8, 1, "--pipeline.micro_batches=0: a batch splits into at least one"),
        (PipelineOptions(stages_per_rank=2), 2, 8, 1, "schedule=1f1b runs one stage per process, not"),
        (PipelineOptions(schedule="gpipe", stages_per_rank=0), 2, 8, 1, "not --pipeline.stages_per_rank=0"),
        (PipelineOptions(schedule="interleaved_1f1b"), 2, 8, 1, "has 2 pipeline rank(s) and --pipeline.stages_per"),
        (PipelineOptions(**INTERLEAVED), 1, 8, 1, "this run has 1 pipeline rank(s) and --pipeline.stages_per_rank=2"),
        (PipelineOptions(micro_batches=9, **INTERLEAVED), 4, 36, 1, "--pipeline.micro_batches=9 is not a count"),
    ],
    ids=["micro-batches", "data-parallel", "accumulation", "sizes", "no-micro-batch", "one-stage-schedule",
         "no-stage", "one-stage-interleaved", "one-rank-interleaved", "rounds"],
)  # fmt: skip
def test_sizes_and_schedules_that_would_hang_or_mismatch_are_refused(options, processes, batch, accumulate, message):
    with pytest.raises(ConfigurationError, match="Fix:") as refused:
        check_pipeline(options, processes, Staged, batch, accumulate)
    assert message in str(refused.value)
    check_pipeline(PipelineOptions(micro_batches=4, data_parallel_size=2), 4, Staged, 16, 1)  # 2 stages, 4 x 2
    check_pipeline(PipelineOptions(), 2, Staged, None, 1)  # no global batch (a plain loader): the first batch checks


def test_interleaved_takes_the_micro_batch_counts_torch_takes():
    # torch's ScheduleInterleaved1F1B runs max(1, m // ranks) rounds, which must divide m: with 4 ranks, 9
    # micro-batches make 2 rounds (refused), 10 two rounds of 5, 3 a single round of fewer than the ranks
    for micro_batches in (3, 4, 5, 8, 10, 12):
        check_pipeline(PipelineOptions(micro_batches=micro_batches, **INTERLEAVED), 4, Staged, None, 1)
    with pytest.raises(ConfigurationError) as refused:
        check_pipeline(PipelineOptions(micro_batches=9, **INTERLEAVED), 4, Staged, None, 1)
    assert "Fix: --pipeline.micro_batches=8 or 10 (any multiple of 4 works)" in str(refused.value)


def test_a_hook_that_changes_the_model_or_leaves_a_parameter_out_is_refused():
    class Deleting(Chain):
        def pipeline_stage(self, index: int, count: int) -> nn.Module:
            self.layers[1] = nn.Identity()  # the contract before stages shared the model's layers
            return super().pipeline_stage(index, count)

    class Forgetting(Chain):
        def pipeline_stage(self, index: int, count: int) -> nn.Module:
            return self.layers[index]

    with pytest.raises(ConfigurationError, match=r"Deleting\.pipeline_stage changed the model"):
        check_stages(Deleting(), 3)
    with pytest.raises(ConfigurationError, match=r"leaves 1 parameter\(s\) in no stage of 3 \(e\.g\. embed\.weight\)"):
        check_stages(Forgetting(), 3)


def test_bubble_fraction_is_the_idle_share_of_fill_and_drain():
    assert bubble_fraction(1, 4) == 0
    assert bubble_fraction(2, 2) == pytest.approx(1 / 3) and bubble_fraction(4, 12) == pytest.approx(3 / 15)
    # v stages per rank: each fill and drain step is v times shorter, (p - 1) / (v m) of the ideal time
    assert bubble_fraction(2, 4, 2) == pytest.approx(1 / 9) and bubble_fraction(4, 8, 1) == bubble_fraction(4, 8)
    bubble = bubble_fraction(4, 8, 2)
    assert bubble / (1 - bubble) == pytest.approx((4 - 1) / (2 * 8))  # Narayanan et al. 2021
