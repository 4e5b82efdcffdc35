"""``src/strategies/pipeline.py`` without a pipelined model (the GPT example's runs are in
tests/examples/test_gpt_pipeline.py): a model without the hooks is refused before launch, the checks of the
sizes and schedules, the checks of a model's stages, the removal of other stages' layers, the bubble, tied
weights, a resume from a folder that would run code refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from src.cli import main
from src.errors import ConfigurationError
from src.strategies.pipeline import (
    HeldElsewhere,
    PipelineOptions,
    PipelineStrategy,
    bubble_fraction,
    check_pipeline,
    check_stages,
    remove_other_stages,
    shard_stages,
    tied_parameter_names,
)
from tests.conftest import TINY
from tests.helpers import RUNS_COMMAND_GLOBAL, folder_whose_index_runs_code


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


class Chain(nn.Module):
    """An embedding, three linear layers and an output layer tied to the embedding; stage ``i`` of 3 runs layer
    ``i``, the first also the embedding, the last also the output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(3))
        self.out = nn.Linear(3, 5, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(()))

    def pipeline_stage(self, index: int, count: int) -> nn.Module:
        first = [self.embed] if index == 0 else []
        return nn.Sequential(*first, self.layers[index], *([self.out] if index == count - 1 else []))


def test_a_process_keeps_its_stages_layers_under_their_names_and_placeholders_for_the_others():
    model = Chain()
    check_stages(model, 3)  # every parameter in a stage, the model unchanged
    stages = [model.pipeline_stage(index, 3) for index in (0, 2)]  # rank 0 of 2 ranks holding stages 0 and 2
    remove_other_stages(model, stages)
    assert [name for name, _ in model.named_parameters()] == [
        "embed.weight", "layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"
    ]  # fmt: skip
    assert isinstance(model.layers[1], HeldElsewhere) and not list(model.layers[1].parameters())
    assert model.out is stages[1][-1]  # the last stage's output layer stays: a stage of this process runs it
    with pytest.raises(RuntimeError, match="held by another pipeline process"):
        model.layers[1](torch.zeros(3))
    middle = Chain()
    remove_other_stages(middle, [middle.pipeline_stage(1, 3)])
    assert [name for name, _ in middle.named_parameters()] == ["layers.1.weight", "layers.1.bias"]
    assert list(dict(middle.named_buffers())) == ["scale"]  # a buffer of the model itself stays


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


@pytest.fixture
def data_parallel_mesh(tmp_path) -> Iterator[object]:
    """A real (gloo, one process) process group and its one-rank data-parallel mesh."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
    finally:
        dist.destroy_process_group()


def test_each_stage_becomes_the_root_of_its_rest_and_a_sharded_whole_network_is_refused(data_parallel_mesh):
    model = Chain()
    stages = {index: model.pipeline_stage(index, 3) for index in (0, 2)}
    remove_other_stages(model, list(stages.values()))
    for layer in (model.layers[0], model.layers[2]):  # what a configure_model does: the layers
        fully_shard(layer, mesh=data_parallel_mesh)
    shard_stages(stages, data_parallel_mesh, "Chain")
    assert all(isinstance(stage, FSDPModule) for stage in stages.values())
    assert all(isinstance(parameter, torch.distributed.tensor.DTensor) for parameter in model.parameters())
    tokens = torch.tensor([1, 2])
    assert stages[2](stages[0](tokens)).shape == (2, 5)  # the stages run, each gathering its own parameters

    whole = Chain()
    stages = {index: whole.pipeline_stage(index, 3) for index in (0, 2)}
    remove_other_stages(whole, list(stages.values()))
    fully_shard(whole, mesh=data_parallel_mesh)  # the root of a network no process runs whole
    with pytest.raises(
        ConfigurationError, match=r"Chain\.configure_model sharded a module around the layers of pipeline"
    ):
        shard_stages(stages, data_parallel_mesh, "Chain")


def test_bubble_fraction_is_the_idle_share_of_fill_and_drain():
    assert bubble_fraction(1, 4) == 0
    assert bubble_fraction(2, 2) == pytest.approx(1 / 3) and bubble_fraction(4, 12) == pytest.approx(3 / 15)
    # v stages per rank: each fill and drain step is v times shorter, (p - 1) / (v m) of the ideal time
    assert bubble_fraction(2, 4, 2) == pytest.approx(1 / 9) and bubble_fraction(4, 8, 1) == bubble_fraction(4, 8)
    bubble = bubble_fraction(4, 8, 2)
    assert bubble / (1 - bubble) == pytest.approx((4 - 1) / (2 * 8))  # Narayanan et al. 2021


def test_a_tied_weight_is_found_under_both_names():
    net = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    assert tied_parameter_names(net) == []
    net[1].weight = net[0].weight
    assert tied_parameter_names(net) == [("0.weight", "1.weight")]


def test_a_resume_reads_the_folder_checked_and_refuses_one_that_would_run_code(tmp_path):
    """The strategy's own read (each rank's, after the checks before launch): the folder's index is checked before
    torch reads it (src/checkpoints/safe.py; a real pipeline resume: tests/examples/test_gpt_pipeline.py)."""
    folder = folder_whose_index_runs_code(tmp_path / "last.ckpt", tmp_path / "ran")
    with pytest.raises(ConfigurationError, match=f"holds {RUNS_COMMAND_GLOBAL}"):
        PipelineStrategy().load_checkpoint(folder)
    assert not (tmp_path / "ran").exists()
