"""Strategies train the same model: single device, dp, ddp and ddp_spawn, with accumulation and precision.

fp64 runs show the math is identical (differences at rounding level, ~1e-14); that fp32 ddp agrees with one
process to fp32 rounding is shown by the ddp run of tests/workflows/test_reproducibility.py. Runs of one process
(one device, dp on the CPU) train in this process; ddp and ddp_spawn launch the CLI. The ddp run is also stopped
by a signal to rank 1 alone and resumed before it is compared: the ranks agree on the stop, and the resumed run
ends with the one-process weights; the ddp_spawn run accumulates 2 micro-batches per process, which keeps the
global batch and so the training.
"""

import json
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from multigpu.strategies import register_strategies
from tests import prewarmed
from tests.cli import main
from tests.conftest import (
    REPO,
    TINY,
    cli_env,
    last_value,
    load_state,
    read_metrics,
    relative_difference,
)
from tests.fixtures.workload import TinyClassifier, TinyData

#: the reference fixture is shared by most tests: one worker trains it once
pytestmark = pytest.mark.xdist_group("test_same_model")

STEPS = 24  # optimizer steps per comparison run (global batch 32 of 512 samples: shuffled, crosses an epoch)
FP64 = ["--trainer.precision=64-true"]
SINGLE = ["--trainer.devices=1"]
DDP = ["--trainer.strategy=ddp", "--trainer.devices=2"]
DDP_SPAWN = ["--trainer.strategy=ddp_spawn", "--trainer.devices=2"]
DP_CPU = ["--trainer.strategy=dp", "--trainer.devices=2"]


def fit(run_cli, run_dir: Path, *args: str) -> tuple[dict, list[dict]]:
    """Train ``STEPS`` steps: in this process for one process (``run_cli=None``), else through the CLI's launch."""
    args = ("fit", *TINY, f"--trainer.default_root_dir={run_dir}", f"--trainer.max_steps={STEPS}", *args)
    if run_cli is None:
        main([*args, "--progress_bar=none"])
    else:
        run_cli(*args)
    return load_state(run_dir / "checkpoints" / "last.ckpt"), read_metrics(run_dir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict, list[dict]]:
    """The single-process fp64 run every other strategy is compared with."""
    return fit(None, tmp_path_factory.mktemp("single"), *FP64, *SINGLE)


#: rank 1 alone gets the preemption signal after step 7
SIGNAL_RANK_1 = ["--trainer.callbacks+=tests.helpers.SignalAtStep", "--trainer.callbacks.step=7",
                 "--trainer.callbacks.rank=1"]  # fmt: skip


#: ddp_spawn accumulates 2 micro-batches of 8 in each of its 2 processes: the global batch and the training stay
SPAWN_ACCUMULATE_2 = [*DDP_SPAWN, "--trainer.accumulate_grad_batches=2"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", [DDP, SPAWN_ACCUMULATE_2, DP_CPU], ids=["ddp-stopped-on-rank-1", "ddp_spawn-accumulate2", "dp"]
)
def test_strategy_trains_the_same_model_as_one_process(strategy, reference, run_cli, tmp_path):
    run_dir = tmp_path / "run"
    if strategy == DDP:  # stopped by the signal to rank 1 and resumed
        args = [*TINY, f"--trainer.default_root_dir={run_dir}", f"--trainer.max_steps={STEPS}", *FP64, *DDP]
        stopped = run_cli("fit", *args, *SIGNAL_RANK_1, check=False)
        assert stopped.returncode == 75, stopped.stderr[-2000:]
        # the ranks learn of the signal through an all-reduce read one step later: saved after step 8
        assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 8
        state, rows = fit(run_cli, run_dir, *FP64, *strategy, "--ckpt_path=last")
    else:
        state, rows = fit(None if strategy == DP_CPU else run_cli, run_dir, *FP64, *strategy)
    ref_state, ref_rows = reference
    assert relative_difference(ref_state, state) < 1e-10
    for key in ("val/loss", "val/acc"):  # torchmetrics accumulates in fp32
        assert last_value(rows, key) == pytest.approx(last_value(ref_rows, key), rel=1e-6)
    assert last_value(rows, "step") == STEPS - 1


def test_accumulation_keeps_the_same_training(reference, tmp_path):
    """4 micro-batches of 8 in one process (2 of 8 in each of 2 processes: the ddp_spawn run above)."""
    state, _ = fit(None, tmp_path / "run", *FP64, *SINGLE, "--trainer.accumulate_grad_batches=4")
    assert relative_difference(reference[0], state) < 1e-10


# -- dp on Lightning 2.x ---------------------------------------------------------------------------------------


def test_dp_is_registered_by_each_cli_run_not_by_importing_the_cli(tmp_path):
    """A fresh interpreter: ``import tests.cli`` leaves Lightning's registry alone, and the CLI's entry point (what
    ``python -m tests.cli`` runs) registers ``dp`` itself, so ``--trainer.strategy=dp`` trains."""
    code = (
        "import sys; import tests.cli; from lightning.pytorch.strategies import StrategyRegistry;"
        " print('after import:', 'dp' in StrategyRegistry); tests.cli.main(sys.argv[1:])"
    )
    args = [*TINY, "--trainer.strategy=dp", "--trainer.max_steps=1", "--trainer.limit_val_batches=0"]
    result = prewarmed.run(
        [sys.executable, "-c", code, "fit", *args, "--progress_bar=none", f"--trainer.default_root_dir={tmp_path}"],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after import: False" in result.stdout
    (plan,) = tmp_path.rglob("run_plan.json")
    assert json.loads(plan.read_text())["strategy"] == "DataParallelStrategy"


def test_dp_on_cpu_runs_as_one_device_with_a_warning_and_the_same_result():
    """In-process, fp32: dp with accelerator=cpu is exactly single-device training."""

    def train(**trainer_args) -> dict:
        L.seed_everything(0)
        model = TinyClassifier()
        data = TinyData(train_size=256, val_size=64, batch_size=32)
        trainer = L.Trainer(
            accelerator="cpu",
            max_steps=6,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=1,
            **trainer_args,
        )
        trainer.fit(model, data)
        assert trainer.world_size == 1
        return model.state_dict()

    register_strategies()
    single = train(devices=1)
    with pytest.warns(UserWarning, match="strategy=dp with accelerator=cpu runs as a single device"):
        dp = train(strategy="dp", devices=2)
    for key in single:
        assert torch.equal(single[key], dp[key]), key


# -- precision (16-mixed on a CPU, bf16 said once under ddp: tests/errors/test_quiet.py) ---------------------------


@pytest.mark.parametrize(("precision", "dtype"), [("bf16-true", torch.bfloat16), ("64-true", torch.float64)])
def test_true_precisions_keep_the_weights_in_that_dtype(precision, dtype, tmp_path):
    main(
        [
            "fit",
            *TINY,
            f"--trainer.precision={precision}",
            "--trainer.max_steps=2",
            "--trainer.limit_val_batches=1",
            f"--trainer.default_root_dir={tmp_path}",
            "--progress_bar=none",
        ]
    )
    state = load_state(tmp_path / "checkpoints" / "last.ckpt")
    assert state["net.0.weight"].dtype == dtype


def test_bf16_mixed_runs_under_autocast_on_cpu(tmp_path, capsys):
    main(
        [
            "fit",
            *TINY,
            "--trainer.precision=bf16-mixed",
            "--trainer.max_steps=2",
            "--trainer.limit_val_batches=1",
            f"--trainer.default_root_dir={tmp_path}",
            "--progress_bar=none",
        ]
    )
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


# -- bad strategy, device and cluster settings ---------------------------------------------------------------------


def expect_error(capsys, args: list[str], *needles: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *TINY, *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err


def test_unknown_strategy_lists_the_valid_ones_with_dp(capsys):
    expect_error(
        capsys, ["--trainer.strategy=dpp"], "--trainer.strategy=dpp is not a known strategy", " dp,", "ddp_spawn"
    )


def test_more_devices_than_the_machine_has(capsys):
    expect_error(capsys, ["--trainer.accelerator=cpu", "--trainer.devices=4096"], "--trainer.devices=4096", "at most")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_gpu_accelerator_without_a_gpu(capsys):
    expect_error(capsys, ["--trainer.accelerator=gpu"], "no CUDA GPU", "--trainer.accelerator=cpu")


def test_dp_across_nodes_is_refused(capsys):
    expect_error(
        capsys,
        ["--trainer.strategy=dp", "--trainer.accelerator=cpu", "--trainer.num_nodes=2"],
        "cannot span --trainer.num_nodes=2",
        "ddp",
    )


SRUN_STEP = {
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_NNODES": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NAME": "train",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
}


def test_ddp_spawn_inside_srun_is_refused(capsys, monkeypatch):
    for key, value in SRUN_STEP.items():
        monkeypatch.setenv(key, value)
    expect_error(capsys, ["--trainer.accelerator=cpu", *DDP_SPAWN], "inside an srun step", "--trainer.strategy=ddp")


def test_slurm_allocation_that_does_not_match_the_devices(capsys, monkeypatch):
    for key, value in {**SRUN_STEP, "SLURM_NTASKS": "4", "SLURM_NNODES": "2"}.items():
        monkeypatch.setenv(key, value)
    expect_error(
        capsys,
        ["--trainer.accelerator=cpu", *DDP],
        "SLURM started 4 task(s) on 2 node(s)",
        "--trainer.devices=2 --trainer.num_nodes=2",
    )
