"""A finished run continued with larger limits equals an uninterrupted run.

A run stopped by ``--trainer.max_steps``, ``max_epochs`` or ``max_time`` and continued with a larger limit and
``--ckpt_path=last`` (same run directory) is compared with one run that never stopped: every value in
``last.ckpt`` (the weights in fp64 bit for bit, the optimizer and LR scheduler, the loop counters, the callbacks'
state and the best checkpoint it names), every validation row of ``metrics.csv`` (each ``val/*`` column, with its
step and epoch, across the logger versions of the continued run) and the checkpoint files. Under ddp the same
comparison runs on a ddp run of tests/faults/test_preemption.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, Timer
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, TensorDataset

from multigpu.checkpoints.continuation import (
    ExactContinuation,
    RunTimer,
    epoch_interrupted,
    restarts_a_finished_epoch,
    resumable,
    save_as_mid_epoch,
    save_as_next_epoch_start,
    uncount_epoch_end,
)
from multigpu.compat import logging_step, set_logging_step
from tests.cli import TemplateCLI, main
from tests.conftest import TINY, read_metrics

#: the uninterrupted 40-step run is shared by several tests: one worker trains it once
pytestmark = pytest.mark.xdist_group("test_continuation")

STEPS_PER_EPOCH = 16  # TINY: 512 samples, global batch 32
FP64 = [*TINY, "--progress_bar=none", "--trainer.precision=64-true", "--trainer.max_epochs=-1"]
#: a step-interval scheduler, so that its state has to continue too
STEP_LR = [
    "--model.init_args.lr_scheduler=torch.optim.lr_scheduler.StepLR",
    "--model.init_args.lr_scheduler.init_args.step_size=7",
    "--model.init_args.lr_scheduler.init_args.gamma=0.7",
]
MID_EPOCH_VALIDATION = ["--trainer.val_check_interval=8", *STEP_LR]
LOADER_NOTE = "has no state_dict/load_state_dict"


# -- what two runs are compared on --------------------------------------------------------------------------------


def _flat(value: Any, key: str, out: dict[str, Any], run_dir: Path) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(v, f"{key}/{k}".replace(str(run_dir), "<run dir>"), out, run_dir)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _flat(v, f"{key}[{i}]", out, run_dir)
    elif isinstance(value, torch.Tensor):
        out[key] = (value.dtype, tuple(value.shape), value.cpu().numpy().tobytes())  # bit for bit
    elif isinstance(value, str):
        out[key] = value.replace(str(run_dir), "<run dir>")
    else:
        out[key] = value


def checkpoint_facts(run_dir: Path) -> dict[str, Any]:
    """Everything ``last.ckpt`` holds, flattened, with the run directory taken out of paths and the timer's clock
    (the one value that depends on the machine's speed) left out."""
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    facts: dict[str, Any] = {}
    _flat(checkpoint, "", facts, run_dir)
    return {key: value for key, value in facts.items() if "time_elapsed" not in key}


def validation_rows(run_dir: Path) -> list[dict[str, str]]:
    """Every metrics.csv row with a val/* value (step, epoch and all val/* columns), over all logger versions."""
    logged = (run_dir / "logs").glob("version_*/metrics.csv")  # a run stopped before its first row writes none
    versions = sorted((p.parent for p in logged), key=lambda p: int(p.name.split("_")[1]))
    rows = []
    for version in versions:
        for row in read_metrics(run_dir, int(version.name.split("_")[1])):
            values = {key: value for key, value in row.items() if key.startswith("val/") and value != ""}
            if values:
                rows.append({"step": row["step"], "epoch": row["epoch"], **values})
    return rows


def assert_same_run(continued: Path, straight: Path) -> None:
    rows = validation_rows(straight)
    assert rows and validation_rows(continued) == rows
    facts, expected = checkpoint_facts(continued), checkpoint_facts(straight)
    weights = [key for key in expected if key.startswith("/state_dict/net.")]
    assert weights and all(expected[key][0] == torch.float64 for key in weights)
    assert facts == expected  # weights, optimizer, LR scheduler, loops, best checkpoint: all identical
    assert sorted(p.name for p in (continued / "checkpoints").iterdir()) == sorted(
        p.name for p in (straight / "checkpoints").iterdir()
    )


def saved(run_dir: Path) -> dict[str, Any]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def straight_40(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    main(["fit", *FP64, *MID_EPOCH_VALIDATION, "--trainer.max_steps=40", f"--trainer.default_root_dir={run_dir}"])
    return run_dir


# -- max_steps ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "stop",
    [20, 24, 16],
    ids=["mid-epoch", "mid-epoch-on-a-validation-step", "epoch-end"],
)
def test_max_steps_extended_equals_an_uninterrupted_run(stop, straight_40, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["fit", *FP64, *MID_EPOCH_VALIDATION, f"--trainer.default_root_dir={run_dir}"]
    main([*args, f"--trainer.max_steps={stop}"])
    first = saved(run_dir)
    assert first["global_step"] == stop
    assert first["epoch"] == (stop - 1) // STEPS_PER_EPOCH if stop % STEPS_PER_EPOCH else stop // STEPS_PER_EPOCH
    main([*args, "--trainer.max_steps=40", "--ckpt_path=last"])
    assert saved(run_dir)["global_step"] == 40
    assert_same_run(run_dir, straight_40)
    assert LOADER_NOTE not in capsys.readouterr().err  # the template's loader continues where it stopped


@pytest.mark.slow
def test_a_run_extended_twice_by_different_limits_equals_an_uninterrupted_run(straight_40, tmp_path):
    """20 steps, then to the end of epoch 2 by max_epochs alone (Lightning restarts loops only mid-epoch then),
    then to 40 steps."""
    run_dir = tmp_path / "run"
    args = ["fit", *FP64, *MID_EPOCH_VALIDATION, f"--trainer.default_root_dir={run_dir}"]
    main([*args, "--trainer.max_steps=20"])
    main([*args, "--trainer.max_steps=-1", "--trainer.max_epochs=2", "--ckpt_path=last"])
    assert saved(run_dir)["global_step"] == 2 * STEPS_PER_EPOCH
    main([*args, "--trainer.max_steps=40", "--ckpt_path=last"])
    assert_same_run(run_dir, straight_40)


# -- max_epochs ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("step_limit", ["-1", "100"], ids=["epochs-only", "with-a-larger-max-steps"])
def test_max_epochs_extended_equals_an_uninterrupted_run(step_limit, tmp_path):
    def fit(run_dir: Path, epochs: int, *extra: str) -> None:
        main(
            [
                "fit",
                *FP64,
                *STEP_LR,
                f"--trainer.max_steps={step_limit}",
                f"--trainer.max_epochs={epochs}",
                f"--trainer.default_root_dir={run_dir}",
                *extra,
            ]
        )

    fit(tmp_path / "straight", 3)
    fit(tmp_path / "run", 1)
    assert saved(tmp_path / "run")["global_step"] == STEPS_PER_EPOCH
    fit(tmp_path / "run", 3, "--ckpt_path=last")
    assert saved(tmp_path / "run")["global_step"] == 3 * STEPS_PER_EPOCH
    assert_same_run(tmp_path / "run", tmp_path / "straight")


# -- max_time -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_max_time_extended_continues_exactly_where_it_stopped(tmp_path):
    """Stopped by a 2-second max_time (steps paced to 0.1 s), then continued with an hour and max_steps=40: the
    same batches in the same order as one run to step 40 (no batch skipped or repeated), the same validations
    (none added at the stop) and the same end. Accumulating 2 micro-batches per step, the stop must also fall on
    a step boundary."""
    args = [*FP64, "--trainer.accumulate_grad_batches=2"]

    def record(path: Path) -> list[str]:
        return ["--trainer.callbacks+=tests.helpers.RecordParameters", f"--trainer.callbacks.path={path}"]

    straight, run_dir = tmp_path / "straight", tmp_path / "run"
    hour = ["--trainer.max_time=00:01:00:00", "--trainer.max_steps=40"]
    main(["fit", *args, *hour, *record(tmp_path / "straight.txt"), f"--trainer.default_root_dir={straight}"])
    pace = ["--trainer.callbacks+=tests.helpers.Pace", "--trainer.callbacks.seconds=0.1"]
    main(
        [
            "fit",
            *args,
            "--trainer.max_time=00:00:00:02",
            *pace,
            *record(tmp_path / "run.txt"),
            f"--trainer.default_root_dir={run_dir}",
        ]
    )
    stopped_at = saved(run_dir)["global_step"]
    assert 0 < stopped_at < 40
    lines = (tmp_path / "run.txt").read_text().splitlines()
    assert len(lines) == 2 * stopped_at  # two micro-batches per step: stopped on a step boundary
    resume = [f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last"]
    main(["fit", *args, *hour, *record(tmp_path / "run.txt"), *resume])
    # step, batch index in the epoch and the parameters after every micro-batch: the same sequence
    assert (tmp_path / "run.txt").read_text() == (tmp_path / "straight.txt").read_text()
    assert_same_run(run_dir, straight)


# -- plain DataLoaders --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("engine_sampling", [True, False])
def test_continuing_with_a_plain_dataloader_continues_its_epoch_or_says_it_restarts(tmp_path, capsys, engine_sampling):
    """A user's plain DataLoader sampled by the engine continues where it stopped; left as it is
    (``--trainer.use_distributed_sampler=false``) it has no position to restore, and the continued run says, once,
    that Lightning restarts the interrupted epoch's data."""
    args = [
        "fit",
        "--trainer.accelerator=cpu",
        "--trainer.enable_model_summary=false",
        "--progress_bar=none",
        "--model=tests.zoo.regression.Regressor",
        "--data=tests.zoo.regression.RegressionData",
        "--data.init_args.batch_size=8",  # 64 samples: 8 steps per epoch
        "--checkpoint.monitor=val/mse",
        "--trainer.max_epochs=-1",
        f"--trainer.use_distributed_sampler={str(engine_sampling).lower()}",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]
    main([*args, "--trainer.max_steps=3"])
    assert LOADER_NOTE not in capsys.readouterr().err
    with warnings.catch_warnings(record=True) as caught:
        main([*args, "--trainer.max_steps=6", "--ckpt_path=last"])
    assert not [w for w in caught if "dataloader is not resumable" in str(w.message)]  # said once, by the note
    notes = [line for line in capsys.readouterr().err.splitlines() if LOADER_NOTE in line]
    assert saved(tmp_path / "run")["global_step"] == 6
    if engine_sampling:
        assert not notes
        return
    assert len(notes) == 1 and notes[0].startswith("note: resuming in the middle of epoch 0 (after 3 training")
    assert "restarts that epoch's data" in notes[0] and "GlobalBatchDataModule" in notes[0]


# -- ddp ----------------------------------------------------------------------------------------------------------

# A finished ddp run continued with a larger max_steps, compared by ``assert_same_run`` with an uninterrupted ddp
# run: tests/faults/test_preemption.py (its ddp run, stopped by SIGTERM to rank 0, is resumed to its
# max_steps=20 and then continued to 40), which shares the uninterrupted two-process run with ddp_spawn.


# -- the pieces, against the Lightning internals they rely on -----------------------------------------------------


def _trainer_after_training(batches_done: int, epochs_done: int, epoch_length: int = 16, last: bool = False):
    """A Trainer whose loop counters are as Lightning leaves them when training ends: ``epochs_done`` epochs
    counted (the one in progress included), ``batches_done`` batches of that epoch finished."""
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, max_steps=1000)
    fit_loop = trainer.fit_loop
    fit_loop.max_batches = epoch_length
    fit_loop.epoch_progress.increment_by(epochs_done)
    batches = fit_loop.epoch_loop.batch_progress
    batches.total.increment_by((epochs_done - 1) * epoch_length + batches_done)
    batches.current.increment_by(batches_done)
    batches.is_last_batch = last
    set_logging_step(trainer, batches.total.completed)
    return trainer


def test_a_mid_epoch_stop_is_saved_as_lightning_saves_a_batch_end():
    trainer = _trainer_after_training(batches_done=4, epochs_done=2)
    assert epoch_interrupted(trainer)
    assert save_as_mid_epoch(trainer)
    assert trainer.current_epoch == 1 and logging_step(trainer) == 19
    assert not save_as_mid_epoch(trainer)  # once only
    # what Lightning concludes from these counters when it resumes them
    trainer.fit_loop.restarting = True
    trainer.fit_loop.update_restart_stage()
    assert trainer.fit_loop.restarted_mid_epoch
    assert trainer.fit_loop.epoch_loop.restarted_on_train_batch_end


class ProgressAtBatchEnd(Callback):
    """Keeps the loops' progress counters as a checkpoint saved in ``on_train_batch_end`` holds them."""

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.saved = progress_counters(trainer)


def progress_counters(trainer: L.Trainer) -> tuple[dict, dict]:
    loop = trainer.fit_loop
    return loop.epoch_progress.state_dict(), loop.epoch_loop.batch_progress.state_dict()


def test_an_uncounted_epoch_end_holds_the_counters_of_a_checkpoint_saved_at_the_last_batch_end():
    probe = ProgressAtBatchEnd()
    trainer = L.Trainer(accelerator="cpu", max_steps=2, limit_train_batches=4, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[probe])  # fmt: skip
    trainer.fit(BoringModel())  # stops after 2 of 4 batches; Lightning counts the epoch as finished
    assert progress_counters(trainer) != probe.saved and trainer.current_epoch == 1
    uncount_epoch_end(trainer)
    assert progress_counters(trainer) == probe.saved and trainer.current_epoch == 0


def test_an_epoch_end_is_saved_as_the_next_epochs_start():
    trainer = _trainer_after_training(batches_done=16, epochs_done=1, last=True)
    assert not epoch_interrupted(trainer)
    save_as_next_epoch_start(trainer)
    batches = trainer.fit_loop.epoch_loop.batch_progress
    assert batches.current.completed == 0 and batches.total.completed == 16 and not batches.is_last_batch
    trainer.fit_loop.restarting = True  # max_steps: Lightning restarts although the epoch is over
    trainer.fit_loop.update_restart_stage()
    assert not trainer.fit_loop.restarted_mid_epoch
    assert restarts_a_finished_epoch(trainer)
    mid = _trainer_after_training(batches_done=4, epochs_done=2)
    save_as_mid_epoch(mid)
    mid.fit_loop.restarting = True
    assert not restarts_a_finished_epoch(mid)


def test_run_timer_keeps_lightnings_timer_state():
    assert RunTimer(duration="00:00:01:00").state_key == Timer(duration="00:00:01:00").state_key == "Timer"
    assert RunTimer(duration={"minutes": 1})._duration == 60


class StatefulDataLoader(DataLoader):
    """A loader that keeps its own position, as torchdata's does."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_resumable_loaders():
    data = TensorDataset(torch.zeros(4, 1))
    assert resumable(StatefulDataLoader(data, batch_size=2))
    assert not resumable(DataLoader(data, batch_size=2))


def test_max_time_and_the_continuation_callback_are_wired_into_the_trainer():
    cli = TemplateCLI(args=[*TINY, "--trainer.max_time=00:00:05:00"], run=False)
    timers = [c for c in cli.trainer.callbacks if isinstance(c, Timer)]
    assert len(timers) == 1 and isinstance(timers[0], RunTimer) and timers[0]._duration == 300
    assert any(isinstance(c, ExactContinuation) for c in cli.trainer.callbacks)
    cli = TemplateCLI(args=TINY, run=False)
    assert not any(isinstance(c, Timer) for c in cli.trainer.callbacks)
