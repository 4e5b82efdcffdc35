"""``fsdp2`` and ``tensor_parallel``: registration, the default sharding policy, clipping across device meshes,
sharded checkpoints (atomic, resumable bit for bit, readable on one device and under ddp, consolidated).

The slow tests train the tests' workload (``TinyClassifier``, which has no ``configure_model``) in fp64 under fsdp2 on
two processes: the default policy must give the model one device trains. They read one module-scoped set of runs, so the
slow tests of ``multigpu/strategies/sharding.py``, ``multigpu/checkpoints/consolidate.py`` (and its command, ``python -m
multigpu.consolidate``) and ``multigpu/checkpoints/sharded.py`` on a trained run are here, not in their mirror files
(tests/strategies/test_sharding.py, tests/checkpoints/test_consolidate.py, tests/checkpoints/test_sharded.py).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.plugins.precision import DoublePrecision
from lightning.pytorch.strategies import StrategyRegistry

from multigpu.checkpoints import sharded as sharded_checkpoint
from multigpu.checkpoints.files import is_intact
from multigpu.checkpoints.sharded import (
    is_sharded_checkpoint,
    load_sharded_checkpoint,
    move_into_place,
    restore_interrupted,
)
from multigpu.errors import ConfigurationError
from multigpu.strategies import FSDP2Strategy, TensorParallelStrategy, register_strategies
from multigpu.strategies.model_parallel import clip_grad_norm, memory_per_rank
from tests import prewarmed
from tests.cli import main
from tests.conftest import REPO, TINY, cli_env, load_state, read_metrics, relative_difference
from tests.fixtures.workload import TinyClassifier
from tests.helpers import RUNS_COMMAND_GLOBAL, entry_runs_code, folder_whose_index_runs_code, hold_at, lines, wait_for

FP64 = ["--trainer.precision=64-true", "--trainer.val_check_interval=8"]
FSDP2 = ["--trainer.strategy=fsdp2", "--trainer.devices=2"]
DROPOUT = ["--model.init_args.dropout=0.2"]  # the training step draws random numbers: a resume restores them
STEPS = 24
#: the slow tests read one module-scoped set of runs: one worker trains it once
pytestmark = pytest.mark.xdist_group("test_model_parallel")


# -- fast: the pieces ----------------------------------------------------------------------------------------------


def test_strategy_names_resolve_and_accept_fp64():
    register_strategies()
    assert StrategyRegistry["fsdp2"]["strategy"] is FSDP2Strategy
    assert StrategyRegistry["tensor_parallel"]["strategy"] is TensorParallelStrategy
    trainer = L.Trainer(strategy="fsdp2", accelerator="cpu", devices=2, precision="64-true", logger=False)
    assert isinstance(trainer.strategy, FSDP2Strategy)
    assert isinstance(trainer.precision_plugin, DoublePrecision)
    assert trainer.world_size == 2


def test_tensor_parallel_refuses_a_model_without_a_plan():
    strategy = TensorParallelStrategy()
    strategy.connect(TinyClassifier())
    with pytest.raises(ConfigurationError, match="configure_model"):
        strategy.setup_environment()


def test_clip_grad_norm_matches_torch_on_plain_tensors():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5)) for _ in range(3)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for a, b in zip(ours, theirs, strict=True):
        a.grad = torch.randn(5)
        b.grad = a.grad.clone()
    total = clip_grad_norm(ours, max_norm=0.5)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm=0.5)
    assert torch.allclose(total, expected)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a.grad, b.grad)


def test_a_precision_plugin_clips_with_the_clip_grad_by_norm_of_the_instance():
    """What ``clip_across_meshes`` and the pipeline strategy rely on when they give the plugin their clipping."""
    clipped: list[float] = []
    trainer = L.Trainer(accelerator="cpu", max_steps=2, gradient_clip_val=0.5, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.precision_plugin.clip_grad_by_norm = lambda optimizer, value: clipped.append(value)
    trainer.fit(BoringModel())
    assert clipped == [0.5, 0.5]


def test_memory_per_rank_counts_parameters_gradients_and_optimizer_state():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False))
    model[1].weight.requires_grad_(False)
    optimizer = torch.optim.Adam(p for p in model.parameters() if p.requires_grad)
    before = memory_per_rank(model, [optimizer])
    assert before == {"parameters": 4 * (12 + 3 + 6), "gradients": 4 * (12 + 3), "optimizer_state": 0}
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    assert memory_per_rank(model, [optimizer])["optimizer_state"] == 2 * 4 * (12 + 3)  # Adam's two moments


@pytest.mark.parametrize("strategy", [FSDP2Strategy, TensorParallelStrategy])
def test_a_resume_reads_the_folder_checked(strategy, tmp_path):
    """The strategies' own read (each rank's, after the checks before launch): a folder's index is checked before
    torch reads it (multigpu/checkpoints/safe.py; trained runs resume through it below)."""
    folder = folder_whose_index_runs_code(tmp_path / "last.ckpt", tmp_path / "ran")
    with pytest.raises(ConfigurationError, match=f"holds {RUNS_COMMAND_GLOBAL}"):
        strategy().load_checkpoint(folder)
    assert not (tmp_path / "ran").exists()


# -- slow: trained runs --------------------------------------------------------------------------------------------


def _fit(run_dir: Path, *args: str, exit_code: int = 0) -> None:
    command = [sys.executable, "-m", "tests.cli", "fit", *TINY, f"--trainer.default_root_dir={run_dir}", *FP64, *args]
    result = prewarmed.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True)
    assert result.returncode == exit_code, result.stderr[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """fp64 runs of the tests' workload: one device (in this process); fsdp2; with dropout, fsdp2 uninterrupted
    and fsdp2 stopped by SIGTERM at step 10 (mid-epoch, between validations: the stop saves the sharded
    ``last.ckpt``) and resumed with ``--ckpt_path=last``."""
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("single", "fsdp2", "dropout", "resumed")}
    main(["fit", *TINY, f"--trainer.default_root_dir={dirs['single']}", *FP64, "--trainer.devices=1",
          f"--trainer.max_steps={STEPS}"])  # fmt: skip  # one process: this one
    _fit(dirs["fsdp2"], *FSDP2, f"--trainer.max_steps={STEPS}")
    _fit(dirs["dropout"], *FSDP2, *DROPOUT, f"--trainer.max_steps={STEPS}")
    stop = ["--trainer.callbacks+=tests.helpers.SignalAtStep", "--trainer.callbacks.step=10"]
    _fit(dirs["resumed"], *FSDP2, *DROPOUT, f"--trainer.max_steps={STEPS}", *stop,
         "--trainer.callbacks.signal_name=SIGTERM", exit_code=143)  # fmt: skip
    # ranks agree on a signal without waiting for each other, so the stop may land a step later
    assert 10 <= load_sharded_checkpoint(last_checkpoint(dirs["resumed"]))["global_step"] < STEPS
    _fit(dirs["resumed"], *FSDP2, *DROPOUT, f"--trainer.max_steps={STEPS}", "--ckpt_path=last")
    return dirs


def validation_rows(run_dir: Path) -> list[tuple[str, str, str]]:
    """Every validation row a run directory logged, over all its launches (a resumed run logs a version each)."""
    versions = range(len(list((run_dir / "logs").glob("version_*"))))
    rows = [row for version in versions for row in read_metrics(run_dir, version)]
    return [(r["step"], r["val/loss"], r["val/acc"]) for r in rows if r.get("val/loss")]


def last_checkpoint(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_default_policy_trains_the_model_one_device_trains(runs):
    sharded = last_checkpoint(runs["fsdp2"])
    assert is_sharded_checkpoint(sharded)
    assert len(list(sharded.glob("*.distcp"))) == 2  # one shard per rank
    state = load_sharded_checkpoint(sharded)
    assert state["global_step"] == STEPS
    assert relative_difference(load_state(last_checkpoint(runs["single"])), state["state_dict"]) < 1e-9
    rows, reference = validation_rows(runs["fsdp2"]), validation_rows(runs["single"])
    assert len(rows) == len(reference) == 3
    for (step, loss, acc), (ref_step, ref_loss, ref_acc) in zip(rows, reference, strict=True):
        assert step == ref_step and acc == ref_acc
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-9)


@pytest.mark.slow
def test_stopped_and_resumed_sharded_run_is_the_uninterrupted_run_bit_for_bit(runs):
    assert validation_rows(runs["resumed"]) == validation_rows(runs["dropout"])
    resumed = load_sharded_checkpoint(last_checkpoint(runs["resumed"]))
    whole = load_sharded_checkpoint(last_checkpoint(runs["dropout"]))
    assert resumed["state_dict"].keys() == whole["state_dict"].keys()
    for name, tensor in whole["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name
    moments, expected = resumed["optimizer_states"][0]["state"], whole["optimizer_states"][0]["state"]
    assert moments.keys() == expected.keys()
    for index, state in expected.items():
        assert all(torch.equal(moments[index][key], value) for key, value in state.items())


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (Linux's ``/proc``): the ranks a launcher started."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    found = [int(child) for child in children.read_text().split()] if children.exists() else []
    return found + [grandchild for child in found for grandchild in descendants(child)]


@pytest.mark.slow
def test_a_sharded_run_killed_before_its_first_validation_resumes_from_its_last_step_exactly(runs, tmp_path):
    """fsdp2 on two processes, a sharded checkpoint every step written in the background (``dcp.async_save``),
    every process killed with SIGKILL at a random step before the first validation (step 8): ``--ckpt_path=last``
    resumes from a step at most two before the kill, and the finished run is the uninterrupted one bit for bit."""
    run_dir, progress = tmp_path / "run", tmp_path / "progress"
    # held at step 7 until the kill: it lands before the validation at 8 however late it comes
    every_step = ["--checkpoint.every_n_train_steps=1", *hold_at(7, tmp_path / "held", progress_file=progress)]
    command = [sys.executable, "-m", "tests.cli", "fit", *TINY, f"--trainer.default_root_dir={run_dir}", *FP64,
               *FSDP2, *DROPOUT, f"--trainer.max_steps={STEPS}", *every_step]  # fmt: skip
    process = prewarmed.popen(command, cwd=REPO, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kill_after = random.randint(3, 6)  # step 2's save began, so step 1's is in place: one write at a time
    wait_for(lambda: len(lines(progress)) >= kill_after, f"step {kill_after}", process=process)
    for pid in [*descendants(process.pid), process.pid]:  # a node failure: no process says goodbye
        os.kill(pid, signal.SIGKILL)
    process.wait()
    reached = len(lines(progress))
    restore_interrupted(last_checkpoint(run_dir).parent)  # as the resume does first: a kill between the two renames
    saved = load_sharded_checkpoint(last_checkpoint(run_dir))["global_step"]
    assert reached - 2 <= saved <= reached + 1 and saved < 8, (kill_after, reached, saved)
    _fit(run_dir, *FSDP2, *DROPOUT, f"--trainer.max_steps={STEPS}", "--checkpoint.every_n_train_steps=1",
         "--ckpt_path=last")  # fmt: skip
    rows = [(r["step"], r["val/loss"], r["val/acc"]) for r in read_metrics(run_dir, 1) if r.get("val/loss")]
    assert rows == validation_rows(runs["dropout"])  # the killed start logged none (its logger had not flushed)
    resumed = load_sharded_checkpoint(last_checkpoint(run_dir))["state_dict"]
    whole = load_sharded_checkpoint(last_checkpoint(runs["dropout"]))["state_dict"]
    assert resumed.keys() == whole.keys()
    assert all(torch.equal(resumed[name], tensor) for name, tensor in whole.items()), (kill_after, saved)


@pytest.mark.slow
def test_one_device_and_ddp_validate_a_sharded_checkpoint(runs, tmp_path):
    sharded = last_checkpoint(runs["fsdp2"])
    losses = {}
    for name, strategy in {"reference": None, "single": ["--trainer.devices=1"]}.items():
        run_dir = tmp_path / name
        checkpoint = last_checkpoint(runs["single"]) if strategy is None else sharded
        main(["validate", *TINY, *FP64, f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={checkpoint}"])
        losses[name] = float(read_metrics(run_dir)[-1]["val/loss"])
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", f"--trainer.default_root_dir={tmp_path / 'ddp'}"]
    command = [sys.executable, "-m", "tests.cli", "validate", *TINY, *FP64, *ddp, f"--ckpt_path={sharded}"]
    result = prewarmed.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    losses["ddp"] = float(read_metrics(tmp_path / "ddp")[-1]["val/loss"])
    assert losses["single"] == pytest.approx(losses["reference"], rel=1e-9)
    assert losses["ddp"] == pytest.approx(losses["reference"], rel=1e-9)


@pytest.mark.slow
def test_consolidate_writes_the_single_file_a_one_device_run_writes(runs, tmp_path):
    output = tmp_path / "whole.ckpt"
    result = prewarmed.run(
        [sys.executable, "-m", "multigpu.consolidate", str(last_checkpoint(runs["fsdp2"])), str(output)],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    whole = torch.load(output, map_location="cpu", weights_only=False)
    single = torch.load(last_checkpoint(runs["single"]), map_location="cpu", weights_only=False)
    assert relative_difference(single["state_dict"], whole["state_dict"]) < 1e-9
    ours, theirs = whole["optimizer_states"][0], single["optimizer_states"][0]
    assert [g["params"] for g in ours["param_groups"]] == [g["params"] for g in theirs["param_groups"]]
    assert (
        relative_difference(
            {f"{i}.{k}": v for i, s in theirs["state"].items() for k, v in s.items() if k != "step"},
            {f"{i}.{k}": v for i, s in ours["state"].items() for k, v in s.items() if k != "step"},
        )
        < 1e-9
    )
    assert whole["global_step"] == single["global_step"] and whole["loops"].keys() == single["loops"].keys()


@pytest.mark.slow
def test_a_trained_folder_whose_shard_would_run_code_is_refused_before_any_rank_starts(runs, tmp_path):
    """A folder two fsdp2 ranks saved, one of its entries that are no tensor replaced by a file that runs code: the
    resume and the consolidation refuse it in one paragraph (multigpu/checkpoints/safe.py; every other crafted file in
    tests/checkpoints/test_safe.py)."""
    run_dir, marker = tmp_path / "run", tmp_path / "ran"
    shutil.copytree(runs["fsdp2"], run_dir)
    folder = last_checkpoint(run_dir)
    shard = entry_runs_code(folder, marker)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    resume = [sys.executable, "-m", "tests.cli", "fit", *TINY, f"--trainer.default_root_dir={run_dir}", *FP64, *FSDP2,
              f"--trainer.max_steps={STEPS + 8}", "--ckpt_path=last"]  # fmt: skip
    consolidate = [sys.executable, "-m", "multigpu.consolidate", str(folder), str(tmp_path / "whole.ckpt")]
    for command in (resume, consolidate):
        result = prewarmed.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True)
        assert result.returncode == 2, result.stderr[-4000:]
        error = result.stderr[result.stderr.index("error: ") :]
        assert "Traceback" not in result.stderr and len(error.strip().splitlines()) == 1, result.stderr
        assert f"{folder / shard} holds Python objects besides tensors ({RUNS_COMMAND_GLOBAL})" in error
    assert not marker.exists() and not (tmp_path / "whole.ckpt").exists()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.mark.slow
def test_an_interrupted_save_leaves_the_previous_checkpoint_resumable(runs, tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints"
    shutil.copytree(runs["fsdp2"] / "checkpoints", folder)
    last = folder / "last.ckpt"
    # killed while writing the shards: the staging folder has no index; the old checkpoint is untouched
    partial = sharded_checkpoint.staging_path(last)
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half")
    assert is_intact(last) and not is_intact(partial)
    # killed between the two renames: the old checkpoint is aside, and restored before `last` is resolved
    replaced = []

    def killed_after_first_rename(src: os.PathLike, dst: os.PathLike) -> None:
        if replaced:
            raise KeyboardInterrupt
        replaced.append(src)
        os.rename(src, dst)

    monkeypatch.setattr(sharded_checkpoint.os, "replace", killed_after_first_rename)
    with pytest.raises(KeyboardInterrupt):
        move_into_place(partial, last)
    monkeypatch.undo()
    assert not last.exists()
    restore_interrupted(folder)
    assert is_intact(last)
    assert load_sharded_checkpoint(last)["global_step"] == STEPS


@pytest.mark.slow
def test_each_rank_holds_half_the_model_gradients_and_optimizer_state(runs):
    def plan(run_dir: Path) -> dict:
        return json.loads((run_dir / "logs" / "version_0" / "run_plan.json").read_text())

    single, sharded = plan(runs["single"]), plan(runs["fsdp2"])
    assert sharded["strategy"] == "FSDP2Strategy" and sharded["global_batch"] == single["global_batch"] == 32
    # every tensor of the tests' workload splits evenly over two ranks
    assert single["parameters_bytes_per_rank"] == 8 * sum(p.numel() for p in TinyClassifier().parameters())
    for name in ("parameters", "gradients"):
        assert sharded[f"{name}_bytes_per_rank"] * 2 == single[f"{name}_bytes_per_rank"]
    logged = [r for r in read_metrics(runs["fsdp2"]) if r.get("perf/optimizer_state_bytes_per_rank")]
    assert logged
    adam_moments = float(logged[-1]["perf/optimizer_state_bytes_per_rank"])  # two per parameter
    assert adam_moments == 2 * sharded["parameters_bytes_per_rank"]
