"""``--trainer.strategy=pipeline`` on the GPT example: its layers in two stages on two CPU processes train the
model one device trains, in fp64 and through the public command: every training-loss row, every validation row
and the final weights, under ``1f1b`` with gradient clipping (the norm over both stages, the tied embedding
counted once) and under ``gpipe`` with gradient accumulation. The 1f1b run is stopped by SIGTERM and resumed from
its sharded checkpoint, so the same comparison proves the exact resume; the checkpoint consolidates into the file
one device writes. Bad settings are refused before any process starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from src.checkpoints.sharded import load_sharded_checkpoint
from src.cli import main
from src.strategies.pipeline import bubble_fraction
from tests.conftest import REPO, cli_env, read_metrics, relative_difference
from tests.examples.conftest import TINY_GPT

RUN = [
    *TINY_GPT,
    "--model.init_args.n_layer=4",  # two blocks per stage
    "--data.init_args.batch_size=8",
    "--trainer.precision=64-true",
    "--trainer.max_steps=8",
    "--trainer.val_check_interval=3",
    "--trainer.limit_val_batches=2",
    "--trainer.log_every_n_steps=1",
    "--progress_bar=none",
]
CLIPPED = ["--trainer.gradient_clip_val=0.5"]
ACCUMULATED = ["--trainer.accumulate_grad_batches=2", "--pipeline.schedule=gpipe", "--pipeline.micro_batches=2"]
PIPELINE = ["--trainer.strategy=pipeline", "--trainer.devices=2"]
pytestmark = pytest.mark.xdist_group("test_gpt_pipeline")


def fit_in_process(*args: str) -> None:
    try:
        main(["fit", *RUN, "--trainer.devices=1", *args])
    except SystemExit as stop:
        assert stop.code in (0, None)


def launch(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "src.cli", "fit", *RUN, *PIPELINE, *args]
    return subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One device (clipped; accumulated) in this process; the pipeline's clipped 1f1b run stopped at step 4 and
    resumed, and its accumulated gpipe run, two processes each."""
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("single", "single_accumulated", "pipeline", "gpipe")}
    fit_in_process(*CLIPPED, f"--trainer.default_root_dir={dirs['single']}")
    fit_in_process(*ACCUMULATED[:1], f"--trainer.default_root_dir={dirs['single_accumulated']}")
    stop = ["--trainer.callbacks+=tests.helpers.SignalAtStep", "--trainer.callbacks.step=4"]
    cut = launch(
        *CLIPPED, *stop, "--trainer.callbacks.signal_name=SIGTERM", f"--trainer.default_root_dir={dirs['pipeline']}"
    )
    assert cut.returncode == 143, cut.stderr[-4000:]
    dirs["cut_stderr"] = cut.stderr  # type: ignore[assignment]
    resumed = launch(*CLIPPED, f"--trainer.default_root_dir={dirs['pipeline']}", "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    gpipe = launch(*ACCUMULATED, f"--trainer.default_root_dir={dirs['gpipe']}")
    assert gpipe.returncode == 0, gpipe.stderr[-4000:]
    dirs["plan"] = gpipe.stdout + gpipe.stderr  # type: ignore[assignment]
    return dirs


def rows(run_dir: Path, key: str) -> dict[str, float]:
    """``step -> value`` of one metric over every logger version of a run (a resumed run writes a new one)."""
    found: dict[str, float] = {}
    for version in sorted((run_dir / "logs").glob("version_*")):
        found.update({r["step"]: float(r[key]) for r in read_metrics(run_dir, int(version.name[8:])) if r.get(key)})
    return found


def assert_same_rows(run: Path, single: Path) -> None:
    """Every validation row of ``single`` and each training-loss row ``run`` logged, equal to fp64 rounding."""
    for key in ("train/loss", "val/loss"):
        expected, got = rows(single, key), rows(run, key)
        assert got and set(got) <= set(expected), (key, got, expected)
        assert key != "val/loss" or set(got) == set(expected)
        for step, value in got.items():
            assert value == pytest.approx(expected[step], rel=1e-9, abs=0), (key, step)


@pytest.mark.slow
def test_1f1b_with_clipping_stopped_and_resumed_trains_the_model_one_device_trains(runs):
    assert "preempted: SIGTERM: saved" in runs["cut_stderr"]
    assert_same_rows(runs["pipeline"], runs["single"])
    assert set(rows(runs["pipeline"], "val/loss")) == set(rows(runs["single"], "val/loss")) == {"2", "5"}
    # the folder of shards, read whole: one device's weights (the tied output layer equal to the embedding)
    whole = load_sharded_checkpoint(runs["pipeline"] / "checkpoints" / "last.ckpt")
    single = torch.load(runs["single"] / "checkpoints" / "last.ckpt", weights_only=False)
    assert whole["global_step"] == single["global_step"] == 8
    assert relative_difference(single["state_dict"], whole["state_dict"]) < 1e-9
    assert torch.equal(whole["state_dict"]["net.lm_head.weight"], whole["state_dict"]["net.tok_emb.weight"])
    one, other = single["optimizer_states"][0], whole["optimizer_states"][0]
    assert [g["params"] for g in other["param_groups"]] == [g["params"] for g in one["param_groups"]]
    for moment in ("exp_avg", "exp_avg_sq"):  # the optimizer state in one device's order
        mine = {str(p): s[moment] for p, s in other["state"].items()}
        assert relative_difference({str(p): s[moment] for p, s in one["state"].items()}, mine) < 1e-9


@pytest.mark.slow
def test_gpipe_with_accumulation_trains_the_model_one_device_trains_and_plans_its_bubble(runs):
    assert_same_rows(runs["gpipe"], runs["single_accumulated"])
    plan = runs["plan"]
    assert "pipeline_stages                 2" in plan and "micro_batches                   2" in plan
    assert "layers_per_stage                2, 2" in plan
    assert f"bubble_fraction                 {bubble_fraction(2, 2):.3f}" in plan  # 1 / 3


@pytest.mark.slow
def test_a_pipeline_checkpoint_validates_on_one_device_and_consolidates(runs, tmp_path):
    folder = runs["pipeline"] / "checkpoints" / "last.ckpt"
    out = tmp_path / "model.ckpt"
    done = subprocess.run([sys.executable, "-m", "src.consolidate", str(folder), str(out)], cwd=REPO, env=cli_env())
    assert done.returncode == 0 and out.is_file()
    losses = {}
    for name, checkpoint in ("folder", folder), ("file", out), ("single", runs["single"] / "checkpoints" / "last.ckpt"):
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
def test_resuming_with_another_stage_count_is_refused_and_the_checkpoint_kept(runs):
    folder = runs["pipeline"] / "checkpoints" / "last.ckpt"
    before = sorted(p.name for p in folder.iterdir())
    command = [sys.executable, "-m", "src.cli", "fit", *RUN, "--trainer.strategy=pipeline", "--trainer.devices=1"]
    result = subprocess.run(
        [*command, f"--trainer.default_root_dir={runs['pipeline']}", "--ckpt_path=last"],
        cwd=REPO, env=cli_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    report = result.stderr.strip().splitlines()[-1]
    assert report.startswith(f"error: --ckpt_path={folder} was saved by a run with 2 pipeline stages; this run has 1")
    assert "Fix:" in report and "Traceback" not in result.stderr
    assert sorted(p.name for p in folder.iterdir()) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*RUN, "--pipeline.micro_batches=1"], "--pipeline.micro_batches=1 is fewer than the 2 pipeline stages"),
        ([*RUN, "--pipeline.micro_batches=3"], "do not split into --pipeline.micro_batches=3 equal micro-batches"),
        ([*RUN, "--pipeline.data_parallel_size=3"], "does not divide the 2 processes into pipelines"),
    ],
    ids=["fewer-micro-batches-than-stages", "uneven-micro-batches", "sizes"],
)
def test_bad_pipeline_settings_are_refused_before_launch(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(["fit", *args, *PIPELINE, "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Fix:" in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_the_gpt_splits_its_blocks_by_parameters_or_where_told():
    from src.models import CausalLanguageModel
    from src.models.gpt import balanced_split

    model = CausalLanguageModel(n_layer=6, n_embd=32, n_head=2, block_size=32)
    assert balanced_split(model.net, 2) == [3] and balanced_split(model.net, 3) == [2, 4]
    stage = model.pipeline_stage(1, 2)
    assert next(name for name, _ in model.named_parameters()) == "net.blocks.3.ln1.weight"  # names kept
    assert stage is model.net and model.net.tok_emb is None and model.net.lm_head is not None
    hidden = torch.randn(2, 5, 32)
    assert stage(hidden).shape == (2, 5, 256)  # activations in, logits out
    told = CausalLanguageModel(n_layer=6, n_embd=32, n_head=2, block_size=32, pipeline_split=[1])
    told.pipeline_stage(0, 2)
    assert list(told.net.blocks) == ["0"] and told.net.lm_head is None
    with pytest.raises(Exception, match="does not cut 6 blocks into 3 stages"):
        CausalLanguageModel(n_layer=6, n_embd=32, n_head=2, pipeline_split=[4, 2]).pipeline_stage(0, 3)


@pytest.mark.slow
def test_prediction_runs_through_the_stages_and_gives_one_devices_tokens(runs, tmp_path):
    folder = runs["pipeline"] / "checkpoints" / "last.ckpt"
    writer = ["--trainer.callbacks+=tests.zoo.writer.SavePredictions", "--trainer.limit_predict_batches=2"]
    predicted = {}
    for name, strategy in ("single", ["--trainer.devices=1"]), ("pipeline", PIPELINE):
        out = tmp_path / name
        args = [*RUN, *strategy, *writer, f"--trainer.callbacks.output_dir={out}", f"--ckpt_path={folder}"]
        command = [sys.executable, "-m", "src.cli", "predict", *args, f"--trainer.default_root_dir={out}"]
        result = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
        predicted[name] = torch.cat(torch.load(out / "predictions_rank0.pt", weights_only=False)["predictions"])
    assert predicted["single"].shape == (16, 32)  # 2 batches of 8 sequences, the next token after each position
    assert torch.equal(predicted["pipeline"], predicted["single"])
