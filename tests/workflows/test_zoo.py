"""Workloads written the way users write them (``tests/zoo/``) train under every strategy with the default config.

How the runs are compared. A plain ``DataLoader``'s ``batch_size`` is the global batch, sampled by the engine in
one order at any world size (multigpu/data/loaders.py); those workloads take their whole training set as one batch
per epoch, and a ``ddp`` or ``ddp_spawn`` run must end with the single-device weights up to fp64 rounding. The GAN's
stream shards itself by rank, so its ``batch_size`` stays per process. The
workload on the template's ``GlobalBatchDataModule`` has 16 steps per epoch, because its order does not depend
on the world size. A ``ddp`` run of a workload whose resume holds state of its own (``ema``: loader workers, the
EMA teacher, a StepLR; ``gan``: two optimizers of manual optimization, an IterableDataset) is stopped by the
preemption signal (exit 75, ``last.ckpt``) and resumed with ``--ckpt_path=last`` before it is compared, which
proves ``ddp`` training, exact resume and equality with one device at once. The others train once, uninterrupted:
``regression`` (a plain shuffled loader stopped at an epoch's end, as ``ema``'s with loader workers is), ``text``
(dict batches and two validation loaders are no state) and ``global_batch`` (the template's loader stopped
mid-epoch under ddp: tests/faults/test_preemption.py, whose workload's data module is one too).
``ddp_spawn`` pickles the model and data module into its workers: it runs the workloads with something of their
own to pickle (the GAN's two optimizers and its IterableDataset; the template's data module, with a rank that
has no validation sample).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from tests.cli import main
from tests.conftest import cli_env, last_value, load_state, read_metrics, relative_difference

#: the single-device runs are shared by most tests: one worker trains them once
pytestmark = pytest.mark.xdist_group("test_zoo")

COMMON = ["--trainer.accelerator=cpu", "--trainer.enable_model_summary=false"]
MISSING_MONITOR = "--checkpoint.monitor=val/loss is not logged by this model"


@dataclass(frozen=True)
class Workload:
    model: str
    data: str
    #: the batch option and its value on one device; under ddp it is halved when it means "per process"
    batch_size: int
    per_process_batch: bool
    #: optimizer steps (``global_step``) per epoch
    steps_per_epoch: int
    #: a metric the model logs at every validation (as metrics.csv names it)
    val_metric: str
    #: the metric the missing-monitor warning suggests (the first one validation logs)
    suggested: str
    extra: tuple[str, ...] = ()

    def args(self, world_size: int = 1) -> list[str]:
        batch = self.batch_size // world_size if self.per_process_batch else self.batch_size
        return [
            f"--model=tests.zoo.{self.model}",
            f"--data=tests.zoo.{self.data}",
            f"--data.init_args.batch_size={batch}",
            *self.extra,
        ]


ZOO = {
    # plain DataLoader with shuffle=True; in-place input scaling and activation; per-step sync_dist + all_gather
    # in validation on a set of 13 (Lightning's sampler pads it to 7 + 7)
    "regression": Workload(
        "regression.Regressor", "regression.RegressionData", 64, False, 1, "val/mse_epoch", "val/mse"
    ),
    # EMA teacher copy, a StepLR schedule, loader workers (resumed too)
    "ema": Workload(
        "ema.EMATeacher",
        "regression.RegressionData",
        64,
        False,
        1,
        "teacher_mse",
        "teacher_mse",
        ("--data.init_args.num_workers=2",),
    ),
    # manual optimization with two optimizers (two optimizer steps per batch); an IterableDataset
    "gan": Workload("gan.TinyGAN", "gan.RingData", 64, True, 2, "ring_error", "ring_error"),
    # dict batches and keyword forward; two validation loaders
    "text": Workload(
        "text.BagOfWordsClassifier",
        "text.SentenceData",
        32,
        False,
        1,
        "val_loss/dataloader_idx_1",
        "val_accuracy/dataloader_idx_0",
    ),
    # the template's data module: global batch of 4 (16 steps per epoch), validation set of 5 (3 + 2 samples)
    "global_batch": Workload(
        "regression.Regressor", "regression.GlobalRegressionData", 4, False, 16, "val/mse_epoch", "val/mse"
    ),
}
EPOCHS = 3


def fit_args(workload: Workload, run_dir: Path, world_size: int = 1) -> list[str]:
    return [
        "fit",
        *COMMON,
        *workload.args(world_size),
        "--trainer.precision=64-true",
        f"--trainer.max_epochs={EPOCHS}",
        f"--trainer.default_root_dir={run_dir}",
    ]


def fit_in_process(args: list[str]) -> list[str]:
    """Run the CLI in this process; return the warning messages it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(args)
    return [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Single-device fp64 runs, trained once per workload and shared by the comparisons; ``messages[name]``: the
    warnings each run raised."""

    class Runs(dict):
        messages: dict[str, list[str]] = {}

        def __missing__(self, name: str) -> Path:
            run_dir = tmp_path_factory.mktemp(f"single-{name}")
            self.messages[name] = fit_in_process(fit_args(ZOO[name], run_dir))
            self[name] = run_dir
            return run_dir

    return Runs()


# -- one device, in-process -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_trains_validates_and_checkpoints_on_one_device_with_the_default_config(name, single_runs):
    workload = ZOO[name]
    tmp_path = single_runs[name]  # the run the ddp and ddp_spawn tests compare with
    messages = single_runs.messages[name]
    # the default monitor (val/loss) is logged by none of them: said once, naming a metric that is logged
    missing = [m for m in messages if MISSING_MONITOR in m]
    assert len(missing) == 1, messages
    assert f"Fix: pass --checkpoint.monitor={workload.suggested} " in missing[0]
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == EPOCHS * workload.steps_per_epoch
    assert not list((tmp_path / "checkpoints").glob("best-*"))
    rows = read_metrics(tmp_path)
    assert len([r for r in rows if r.get(workload.val_metric)]) == EPOCHS  # validated after every epoch


def test_text_model_predicts_into_a_file_and_tests_from_its_checkpoint(single_runs, tmp_path):
    run_dir = single_runs["text"]
    args = [*COMMON, *ZOO["text"].args(), f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"]
    out = tmp_path / "predictions"
    writer = ["--trainer.callbacks+=tests.zoo.writer.SavePredictions", f"--trainer.callbacks.output_dir={out}"]
    main(["predict", *args, f"--trainer.default_root_dir={tmp_path}", *writer])
    saved = torch.load(out / "predictions_rank0.pt", weights_only=False)
    probabilities = torch.cat(saved["predictions"])
    assert probabilities.shape == (9, 2)  # every test sentence once, a distribution over the two classes
    assert torch.allclose(probabilities.sum(-1), torch.ones(9, dtype=probabilities.dtype))
    main(["test", *args, f"--trainer.default_root_dir={tmp_path / 'test'}"])
    assert 0.0 <= last_value(read_metrics(tmp_path / "test"), "test_accuracy") <= 1.0


def test_checkpointing_can_be_switched_off(tmp_path):
    main([*fit_args(ZOO["regression"], tmp_path), "--trainer.enable_checkpointing=false"])
    assert not list(tmp_path.rglob("*.ckpt"))
    assert len([r for r in read_metrics(tmp_path) if r.get("val/mse_epoch")]) == EPOCHS


def test_a_flag_that_contradicts_the_checkpoint_is_refused(tmp_path, capsys):
    args = fit_args(ZOO["regression"], tmp_path)
    main([*args, "--model.init_args.hidden=8", "--trainer.max_epochs=1"])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--ckpt_path=last", "--model.init_args.hidden=12"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--model.init_args.hidden=12" in err and "hidden=8" in err and "Fix:" in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    # the same value as the checkpoint's is no contradiction
    main([*args, "--ckpt_path=last", "--model.init_args.hidden=8", "--trainer.max_epochs=2"])
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["hyper_parameters"]["hidden"] == 8


# -- ddp and ddp_spawn (2 CPU processes), compared with one device ------------------------------------------


def _compare_with_single(run_dir: Path, single: Path) -> None:
    single_state = load_state(single / "checkpoints" / "last.ckpt")
    state = load_state(run_dir / "checkpoints" / "last.ckpt")
    assert relative_difference(single_state, state) < 1e-10


#: the workloads whose ddp run is stopped and resumed: loader workers, the EMA teacher and a StepLR (``ema``), two
#: optimizers of manual optimization and an IterableDataset (``gan``)
STOPPED_UNDER_DDP = ("ema", "gan")


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.extended) if name in ("ema", "text") else name for name in ZOO]
)
def test_zoo_under_ddp_stops_resumes_and_ends_with_the_single_device_weights(name, single_runs, tmp_path, run_cli):
    workload = ZOO[name]
    args = [*fit_args(workload, tmp_path, world_size=2), "--trainer.strategy=ddp", "--trainer.devices=2"]
    if name in STOPPED_UNDER_DDP:
        stop_at = workload.steps_per_epoch  # at an epoch's end: plain loaders cannot resume mid-epoch
        stopped = run_cli(*args, "--trainer.callbacks+=tests.helpers.SignalAtStep",
                          f"--trainer.callbacks.step={stop_at}", check=False)  # fmt: skip
        assert stopped.returncode == 75, stopped.stderr[-3000:]
        assert stopped.stderr.count(MISSING_MONITOR) == 1  # one warning, from rank 0
        # saved at a step boundary once the ranks agree (the same or a following step), before the end of the run
        saved_step = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
        assert stop_at <= saved_step < EPOCHS * workload.steps_per_epoch
        resumed = run_cli(*args, "--ckpt_path=last")
        versions = (0, 1)
    else:
        resumed = run_cli(*args)
        assert resumed.stderr.count(MISSING_MONITOR) == 1  # one warning, from rank 0
        versions = (0,)
    assert "done  epoch" in resumed.stdout  # the plain progress lines, with whatever the model logs
    _compare_with_single(tmp_path, single_runs[name])
    assert len([r for v in versions for r in read_metrics(tmp_path, v) if r.get(workload.val_metric)]) == EPOCHS


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param("gan", marks=pytest.mark.extended), "global_batch"])
def test_zoo_under_ddp_spawn_ends_with_the_single_device_weights(name, single_runs, tmp_path, run_cli):
    workload = ZOO[name]
    extra = ["--data.init_args.val_size=1"] if name == "global_batch" else []  # rank 1 has no validation sample
    run_cli(*fit_args(workload, tmp_path, world_size=2), "--trainer.strategy=ddp_spawn", "--trainer.devices=2", *extra)
    _compare_with_single(tmp_path, single_runs[name])


@pytest.mark.slow
def test_random_seed_is_the_same_on_every_ddp_rank(tmp_path, run_cli):
    record = tmp_path / "seeds.txt"
    run_cli(*fit_args(ZOO["regression"], tmp_path, world_size=2), "--trainer.strategy=ddp", "--trainer.devices=2",
            "--seed_everything=true", "--trainer.max_epochs=1", "--trainer.callbacks+=tests.zoo.callbacks.RecordSeed",
            f"--trainer.callbacks.path={record}", env=cli_env())  # fmt: skip
    seeds = dict(line.split() for line in record.read_text().splitlines())
    assert sorted(seeds) == ["0", "1"] and seeds["0"] == seeds["1"]
    saved = yaml.safe_load((tmp_path / "logs" / "version_0" / "config.yaml").read_text())
    assert str(saved["seed_everything"]) == seeds["0"]


def test_a_users_own_model_trains_through_the_command_line_with_nothing_but_model_and_data(tmp_path, monkeypatch):
    """`python -m tests.cli fit --model=... --data=...`, everything else from configs/default.yaml."""
    monkeypatch.chdir(tmp_path)
    messages = fit_in_process(
        ["fit", "--model=tests.zoo.regression.Regressor", "--data=tests.zoo.regression.RegressionData"]
    )
    assert len([m for m in messages if MISSING_MONITOR in m]) == 1
    run_dir = tmp_path / "runs" / "default"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert len([r for r in read_metrics(run_dir) if r.get("val/mse_epoch")]) == 2  # default.yaml: 2 epochs
    saved = yaml.safe_load((run_dir / "logs" / "version_0" / "config.yaml").read_text())
    # the data module's own defaults, not the image workload's batch_size=128 / val_size=5000 of the same names
    assert saved["data"]["init_args"]["batch_size"] == 64 and saved["data"]["init_args"]["val_size"] == 13
