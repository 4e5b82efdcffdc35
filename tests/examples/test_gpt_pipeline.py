"""``--trainer.strategy=pipeline`` on the GPT example, through the public command, on two CPU processes in fp64.

- Same model: with two stages per process (four stages of one block) under ``interleaved_1f1b``, with gradient
  clipping (the norm over every stage, the tied embedding counted once) and gradient accumulation, every
  training-loss row, every validation row, the final weights and the optimizer state are one device's. (One stage
  per process under ``1f1b`` is compared with one device across two SLURM nodes: test_gpt_pipeline_slurm.py.)
- Exact resume, with randomness on: with dropout, one stage per process under ``1f1b``, stopped by SIGTERM and
  resumed from its sharded checkpoint under ``gpipe``, every row and every weight is the uninterrupted ``1f1b``
  run's, bit for bit (both schedules run each stage's forwards in micro-batch order: the same dropout masks).
- The interleaved checkpoint consolidates into the file one device writes, predicts one device's tokens (written
  once per pipeline) and refuses a resume with another split. Bad settings are refused before any process
  starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multigpu.checkpoints.sharded import load_sharded_checkpoint
from multigpu.strategies.pipeline import bubble_fraction
from src.cli import main
from tests import prewarmed
from tests.conftest import REPO, cli_env, read_metrics, relative_difference
from tests.examples.conftest import TINY_GPT

RUN = [
    *TINY_GPT,
    "--model.init_args.n_layer=4",  # two blocks per stage, or one under two stages per process
    "--data.init_args.batch_size=8",
    "--trainer.precision=64-true",
    "--trainer.max_steps=8",
    "--trainer.val_check_interval=3",
    "--trainer.limit_val_batches=2",
    "--trainer.log_every_n_steps=1",
    "--progress_bar=none",
]
CLIPPED = ["--trainer.gradient_clip_val=0.5"]
ACCUMULATED = ["--trainer.accumulate_grad_batches=2"]
INTERLEAVED = ["--pipeline.schedule=interleaved_1f1b", "--pipeline.stages_per_rank=2"]
DROPOUT = ["--model.init_args.dropout=0.1"]
PIPELINE = ["--trainer.strategy=pipeline", "--trainer.devices=2"]
pytestmark = [pytest.mark.xdist_group("test_gpt_pipeline"), pytest.mark.extended]


def fit_in_process(*args: str) -> None:
    try:
        main(["fit", *RUN, "--trainer.devices=1", *args])
    except SystemExit as stop:
        assert stop.code in (0, None)


def launch(*args: str, command: str = "fit") -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "src.cli", command, *RUN, *PIPELINE, *args]
    return prewarmed.run(argv, cwd=REPO, env=cli_env(), capture_output=True, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One device, clipped and accumulated, in this process; two processes each: the pipeline's clipped and
    accumulated interleaved run, and with dropout its clipped 1f1b run uninterrupted, and stopped at step 4 and
    resumed under gpipe."""
    dirs = {
        name: tmp_path_factory.mktemp(name) for name in ("single_accumulated", "interleaved", "straight", "pipeline")
    }
    fit_in_process(*CLIPPED, *ACCUMULATED, f"--trainer.default_root_dir={dirs['single_accumulated']}")
    interleaved = launch(*CLIPPED, *ACCUMULATED, *INTERLEAVED, f"--trainer.default_root_dir={dirs['interleaved']}")
    assert interleaved.returncode == 0, interleaved.stderr[-4000:]
    dirs["plan"] = interleaved.stdout + interleaved.stderr  # type: ignore[assignment]
    straight = launch(*CLIPPED, *DROPOUT, f"--trainer.default_root_dir={dirs['straight']}")
    assert straight.returncode == 0, straight.stderr[-4000:]
    stop = ["--trainer.callbacks+=tests.helpers.SignalAtStep", "--trainer.callbacks.step=4"]
    cut = launch(*CLIPPED, *DROPOUT, *stop, "--trainer.callbacks.signal_name=SIGTERM",
                 f"--trainer.default_root_dir={dirs['pipeline']}")  # fmt: skip
    assert cut.returncode == 143, cut.stderr[-4000:]
    dirs["cut_output"] = cut.stdout + cut.stderr  # type: ignore[assignment]
    resumed = launch(*CLIPPED, *DROPOUT, "--pipeline.schedule=gpipe", f"--trainer.default_root_dir={dirs['pipeline']}",
                     "--ckpt_path=last")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return dirs


def rows(run_dir: Path, key: str) -> dict[str, float]:
    """``step -> value`` of one metric over every logger version of a run (a resumed run writes a new one)."""
    found: dict[str, float] = {}
    for version in sorted((run_dir / "logs").glob("version_*")):
        found.update({r["step"]: float(r[key]) for r in read_metrics(run_dir, int(version.name[8:])) if r.get(key)})
    return found


def assert_same_rows(run: Path, single: Path) -> None:
    """Every training-loss and validation row of ``single``, equal to fp64 rounding in ``run``: none lost or added
    around a stop."""
    for key in ("train/loss", "val/loss"):
        expected, got = rows(single, key), rows(run, key)
        assert got and set(got) == set(expected), (key, got, expected)
        for step, value in got.items():
            assert value == pytest.approx(expected[step], rel=1e-9, abs=0), (key, step)


def exact_rows(run_dir: Path, key: str) -> dict[str, str]:
    """``step -> value`` of one metric as metrics.csv wrote it, over every logger version of a run."""
    found: dict[str, str] = {}
    for version in sorted((run_dir / "logs").glob("version_*")):
        found.update({r["step"]: r[key] for r in read_metrics(run_dir, int(version.name[8:])) if r.get(key)})
    return found


@pytest.mark.slow
def test_1f1b_with_dropout_stopped_and_resumed_under_gpipe_is_the_uninterrupted_run_bit_for_bit(runs):
    output = runs["cut_output"]
    assert "preempted: SIGTERM: saved" in output
    assert "pipeline_stages                 2" in output and "micro_batches                   4" in output
    assert "layers_per_stage                2, 2" in output
    assert f"bubble_fraction                 {bubble_fraction(2, 4):.3f}" in output  # 1 / 5
    straight, resumed = runs["straight"], runs["pipeline"]
    for key in ("train/loss", "val/loss"):  # steps 0-3 under 1f1b, 4-7 under gpipe: every row, none lost
        assert exact_rows(resumed, key) == exact_rows(straight, key), key
    assert set(exact_rows(straight, "train/loss")) == {str(step) for step in range(8)}
    assert set(exact_rows(straight, "val/loss")) == {"2", "5"}
    whole, expected = (load_sharded_checkpoint(d / "checkpoints" / "last.ckpt") for d in (resumed, straight))
    assert whole["global_step"] == expected["global_step"] == 8
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(whole["state_dict"][name], tensor), name
    assert torch.equal(whole["state_dict"]["net.lm_head.weight"], whole["state_dict"]["net.tok_emb.weight"])


@pytest.mark.slow
def test_two_stages_per_process_interleaved_with_clipping_and_accumulation_train_the_model_one_device_trains(runs):
    plan = runs["plan"]
    assert "pipeline_stages                 4 (2 per rank)" in plan  # stage s on pipeline rank s % 2
    assert (
        "schedule                        interleaved_1f1b" in plan
        and "layers_per_stage                1, 1, 1, 1" in plan
    )
    assert f"bubble_fraction                 {bubble_fraction(2, 4, 2):.3f}" in plan  # 1 / (2 x 4 + 1)
    assert_same_rows(runs["interleaved"], runs["single_accumulated"])
    assert set(rows(runs["interleaved"], "train/loss")) == {str(step) for step in range(8)}
    whole = load_sharded_checkpoint(runs["interleaved"] / "checkpoints" / "last.ckpt")
    single = torch.load(runs["single_accumulated"] / "checkpoints" / "last.ckpt", weights_only=False)
    assert whole["global_step"] == single["global_step"] == 8 and whole["pipeline"]["stages_per_rank"] == 2
    assert relative_difference(single["state_dict"], whole["state_dict"]) < 1e-9
    assert torch.equal(whole["state_dict"]["net.lm_head.weight"], whole["state_dict"]["net.tok_emb.weight"])
    one, other = single["optimizer_states"][0], whole["optimizer_states"][0]
    assert [g["params"] for g in other["param_groups"]] == [g["params"] for g in one["param_groups"]]
    for moment in ("exp_avg", "exp_avg_sq"):  # the optimizer state in one device's order
        mine = {str(p): s[moment] for p, s in other["state"].items()}
        assert relative_difference({str(p): s[moment] for p, s in one["state"].items()}, mine) < 1e-9


@pytest.mark.slow
def test_an_interleaved_checkpoint_validates_on_one_device_and_consolidates(runs, tmp_path):
    folder = runs["interleaved"] / "checkpoints" / "last.ckpt"
    out = tmp_path / "model.ckpt"
    done = prewarmed.run([sys.executable, "-m", "src.consolidate", str(folder), str(out)], cwd=REPO, env=cli_env())
    assert done.returncode == 0 and out.is_file()
    losses = {}
    single = runs["single_accumulated"] / "checkpoints" / "last.ckpt"
    for name, checkpoint in ("folder", folder), ("file", out), ("single", single):
        run_dir = tmp_path / name
        main(
            [
                "validate",
                *RUN,
                "--trainer.devices=1",
                f"--ckpt_path={checkpoint}",
                f"--trainer.default_root_dir={run_dir}",
            ]
        )
        losses[name] = next(iter(rows(run_dir, "val/loss").values()))
    assert losses["folder"] == losses["file"] == pytest.approx(losses["single"], rel=1e-9, abs=0)


@pytest.mark.slow
def test_resuming_with_another_number_of_stages_per_process_is_refused_and_the_checkpoint_kept(runs):
    folder = runs["interleaved"] / "checkpoints" / "last.ckpt"
    before = sorted(p.name for p in folder.iterdir())
    result = launch(f"--trainer.default_root_dir={runs['interleaved']}", "--ckpt_path=last")  # 1f1b, one per rank
    assert result.returncode == 2, result.stderr[-3000:]
    report = result.stderr.strip().splitlines()[-1]
    assert report.startswith(
        f"error: --ckpt_path={folder} was saved by a run with 4 pipeline stages (2 per rank); this run has 2 (1 per"
        " rank). Fix: resume with 2 processes per pipeline"
    )
    assert "--pipeline.stages_per_rank=2" in report and "Traceback" not in result.stderr
    assert sorted(p.name for p in folder.iterdir()) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*RUN, "--pipeline.micro_batches=1"], "--pipeline.micro_batches=1 is fewer than the 2 pipeline stages"),
        ([*RUN, "--pipeline.micro_batches=3"], "do not split into --pipeline.micro_batches=3 equal micro-batches"),
        ([*RUN, "--pipeline.data_parallel_size=3"], "does not divide the 2 processes into pipelines"),
        ([*RUN, "--pipeline.stages_per_rank=2"], "--pipeline.schedule=1f1b runs one stage per process, not"),
        ([*RUN, *INTERLEAVED, "--pipeline.micro_batches=5"], "--pipeline.micro_batches=5 is not a count"),
        ([*RUN, *INTERLEAVED[:1]], "this run has 2 pipeline rank(s) and --pipeline.stages_per_rank=1"),
        (
            [*RUN, *INTERLEAVED[:1], "--pipeline.stages_per_rank=3"],
            "--model.init_args.n_layer=4 blocks cannot make 6 pipeline stages",
        ),
    ],
    ids=["fewer-micro-batches-than-stages", "uneven-micro-batches", "sizes", "one-stage-schedule", "rounds",
         "one-stage-interleaved", "more-stages-than-blocks"],
)  # fmt: skip
def test_bad_pipeline_settings_are_refused_before_launch(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(["fit", *args, *PIPELINE, "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Fix:" in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_the_gpt_gives_each_stage_its_own_layers_and_stays_whole():
    from src.models import CausalLanguageModel
    from src.models.gpt import balanced_split

    model = CausalLanguageModel(n_layer=6, n_embd=32, n_head=2, block_size=32)
    assert balanced_split(model.net, 2) == [3] and balanced_split(model.net, 3) == [2, 4]
    names = [name for name, _ in model.named_parameters()]
    first, second = model.pipeline_stage(0, 2), model.pipeline_stage(1, 2)
    assert [name for name, _ in model.named_parameters()] == names  # the model unchanged
    assert first.blocks[0] is model.net.blocks[0] and second.blocks[0] is model.net.blocks[3]  # shared, not copied
    assert first.lm_head is None and second.tok_emb is None and second.lm_head is model.net.lm_head
    tokens = torch.randint(0, 256, (2, 5))
    hidden = first(tokens)
    assert hidden.shape == (2, 5, 32)  # tokens in, activations out; activations in, logits out
    assert torch.equal(second(hidden), model(tokens))
    told = CausalLanguageModel(n_layer=6, n_embd=32, n_head=2, block_size=32, pipeline_split=[1])
    assert len(told.pipeline_stage(0, 2).layers()) == 1 and len(told.pipeline_stage(1, 2).layers()) == 5
    with pytest.raises(Exception, match="does not cut 6 blocks into 3 stages"):
        CausalLanguageModel(n_layer=6, n_embd=32, n_head=2, pipeline_split=[4, 2]).pipeline_stage(0, 3)


@pytest.mark.slow
def test_prediction_runs_through_two_stages_per_process_writes_once_and_gives_one_devices_tokens(runs, tmp_path):
    folder = runs["interleaved"] / "checkpoints" / "last.ckpt"
    writer = ["--trainer.callbacks+=tests.zoo.writer.SavePredictions", "--trainer.limit_predict_batches=2"]
    out = {name: tmp_path / name for name in ("single", "pipeline")}
    args = [*writer, f"--ckpt_path={folder}"]
    main(["predict", *RUN, "--trainer.devices=1", *args, f"--trainer.callbacks.output_dir={out['single']}",
          f"--trainer.default_root_dir={out['single']}"])  # fmt: skip
    result = launch(*INTERLEAVED, *args, f"--trainer.callbacks.output_dir={out['pipeline']}",
                    f"--trainer.default_root_dir={out['pipeline']}", command="predict")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    predicted = {}
    for name, folder in out.items():
        written = sorted(path.name for path in folder.glob("predictions_*.pt"))
        assert written == ["predictions_rank0.pt"]  # one data-parallel replica: one file, not one per stage
        predicted[name] = torch.cat(torch.load(folder / written[0], weights_only=False)["predictions"])
    assert predicted["single"].shape == (16, 32)  # 2 batches of 8 sequences, the next token after each position
    assert torch.equal(predicted["pipeline"], predicted["single"])
