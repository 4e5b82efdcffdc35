"""Every stop saves, and every resume continues exactly: weights, every validation row and the best checkpoint.

Each case trains the tests' workload in fp64 with dropout on (so the training step draws random numbers, and a
resume must restore every generator), once without interruption and once stopped by a signal and resumed with
``--ckpt_path=last``, and compares the two: the weights bit for bit, every logged validation row
(step and value), and the best checkpoint's name and score. The schedules cover integer, fractional and
time-based ``val_check_interval``, ``check_val_every_n_epoch`` null and N, gradient accumulation and loader
workers; the signals land on an ordinary step, on a step that triggers a validation, on the last batch of an
epoch, during a validation and between the micro-batches of one step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from multigpu.checkpoints.files import is_intact
from multigpu.faults.preemption import SAME_KEY_PRESS_S
from multigpu.run.run_lock import LOCK_FILE
from tests import prewarmed
from tests.checkpoints.test_continuation import assert_same_run as assert_same_continuation
from tests.cli import main
from tests.conftest import REPO, TINY, cli_env, load_state, read_metrics
from tests.errors.test_quiet import assert_no_noise, newcomer_env_in
from tests.helpers import hold_at, lines, wait_for

#: the uninterrupted runs are shared by the tests: one worker trains them once
pytestmark = pytest.mark.xdist_group("test_preemption")

STEPS = 40  # 16 optimizer steps per epoch: two and a half epochs
COMMON = [
    *TINY,
    "--progress_bar=none",
    "--trainer.precision=64-true",
    f"--trainer.max_steps={STEPS}",
    "--trainer.max_epochs=-1",
    "--trainer.limit_val_batches=2",
    "--trainer.log_every_n_steps=1",  # a training row at every step: none may be lost or repeated around a stop
    "--model.init_args.dropout=0.2",
]

SCHEDULES = {
    "every-5-steps-across-epochs": ["--trainer.val_check_interval=5", "--trainer.check_val_every_n_epoch=null"],
    "half-epoch": ["--trainer.val_check_interval=0.5"],
    "every-2nd-epoch": ["--trainer.check_val_every_n_epoch=2"],
    "accumulate-2": [
        "--trainer.accumulate_grad_batches=2",
        "--trainer.val_check_interval=6",
        "--trainer.check_val_every_n_epoch=null",
    ],
    "loader-workers": ["--data.init_args.num_workers=2", "--trainer.val_check_interval=0.5"],
    # dp in one process (on the CPU it runs as one device; on GPUs each replica draws from its device's generator)
    "dp": ["--trainer.strategy=dp", "--trainer.devices=2", "--trainer.val_check_interval=0.5"],
}


def signal_at_step(step: int, name: str = "SIGTERM") -> list[str]:
    return [
        "--trainer.callbacks+=tests.helpers.SignalAtStep",
        f"--trainer.callbacks.step={step}",
        f"--trainer.callbacks.signal_name={name}",
    ]


# (schedule, the stop, the step last.ckpt must hold, the exit code)
CASES = {
    "step-based-validation-in-epoch-2": ("every-5-steps-across-epochs", signal_at_step(20), 20, 143),
    "ordinary-step": ("every-5-steps-across-epochs", signal_at_step(13, "SIGUSR1"), 13, 75),
    "fractional-validation-mid-epoch": ("half-epoch", signal_at_step(8, "SIGINT"), 8, 130),
    "last-batch-of-epoch": ("half-epoch", signal_at_step(16), 16, 143),
    "during-validation": (
        "half-epoch",
        ["--trainer.callbacks+=tests.helpers.SignalDuringValidation", "--trainer.callbacks.step=8"],
        9,
        143,
    ),
    "epoch-end-without-validation": ("every-2nd-epoch", signal_at_step(16), 16, 143),
    "epoch-end-with-validation": ("every-2nd-epoch", signal_at_step(32), 32, 143),
    "mid-accumulation": (
        "accumulate-2",
        ["--trainer.callbacks+=tests.helpers.SignalAtBatch", "--trainer.callbacks.batch_idx=4"],
        3,
        143,
    ),
    "accumulation-validation": ("accumulate-2", signal_at_step(9), 9, 143),
    "loader-workers": ("loader-workers", signal_at_step(11), 11, 143),
    "dp": ("dp", signal_at_step(11), 11, 143),
}


def validation_rows(run_dir: Path) -> list[tuple[str, str]]:
    logged = (run_dir / "logs").glob("version_*/metrics.csv")  # a run stopped before its first row writes none
    versions = sorted((p.parent for p in logged), key=lambda p: int(p.name.split("_")[1]))
    return [
        (r["step"], r["val/loss"])
        for v in versions
        for r in read_metrics(run_dir, int(v.name[8:]))
        if r.get("val/loss")
    ]


def training_rows(run_dir: Path) -> list[tuple[str, str]]:
    """``(step, train/loss)`` of every training row over the run's logger versions, in order."""
    versions = sorted((run_dir / "logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    return [
        (r["step"], r["train/loss"])
        for v in versions
        if (v / "metrics.csv").is_file()
        for r in read_metrics(run_dir, int(v.name[8:]))
        if r.get("train/loss")
    ]


def best_checkpoint(run_dir: Path) -> tuple[str, float]:
    """The best checkpoint's file name and score, as ModelCheckpoint recorded them in last.ckpt."""
    callbacks = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["callbacks"]
    state = next(s for s in callbacks.values() if "best_model_score" in s)
    return Path(state["best_model_path"]).name, float(state["best_model_score"])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, Path]:
    """One uninterrupted run per schedule, trained on first use."""
    runs: dict[str, Path] = {}

    def run(schedule: str) -> Path:
        if schedule not in runs:
            run_dir = tmp_path_factory.mktemp(schedule)
            main(["fit", *COMMON, *SCHEDULES[schedule], f"--trainer.default_root_dir={run_dir}"])
            runs[schedule] = run_dir
        return runs[schedule]

    return run  # type: ignore[return-value]


def assert_same_run(resumed: Path, straight: Path) -> None:
    rows, expected = validation_rows(resumed), validation_rows(straight)
    assert [step for step, _ in rows] == [step for step, _ in expected]  # every validation, at the same step
    assert [float(v) for _, v in rows] == [float(v) for _, v in expected]  # the same numbers, not close ones
    assert training_rows(resumed) == training_rows(straight)  # every step's row, once, none lost at the stop
    assert best_checkpoint(resumed) == best_checkpoint(straight)
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == sorted(
        p.name for p in (straight / "checkpoints").iterdir()
    )
    a, b = load_state(straight / "checkpoints" / "last.ckpt"), load_state(resumed / "checkpoints" / "last.ckpt")
    for key in a:  # tolerance: none, the same operations on the same data in the same order
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_stop_and_resume_match_an_uninterrupted_run(case, uninterrupted, tmp_path):
    schedule, stop, saved_step, exit_code = CASES[case]
    run_dir = tmp_path / "run"
    args = ["fit", *COMMON, *SCHEDULES[schedule], f"--trainer.default_root_dir={run_dir}"]
    with pytest.raises(SystemExit) as stopped:
        main([*args, *stop])
    assert stopped.value.code == exit_code
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == saved_step
    main([*args, "--ckpt_path=last"])
    assert_same_run(run_dir, uninterrupted(schedule))


@pytest.mark.slow
def test_time_based_validation_stop_and_resume(tmp_path):
    """Validations come from the clock, so their steps differ run to run; the weights may not, and no validation
    may be lost or repeated around the stop."""
    timed = [
        *COMMON,
        "--trainer.max_steps=24",
        "--trainer.val_check_interval=00:00:00:01",
        "--trainer.check_val_every_n_epoch=null",
        "--trainer.callbacks+=tests.helpers.Pace",
        "--trainer.callbacks.seconds=0.2",
    ]
    unpaced = timed[: timed.index("--trainer.callbacks+=tests.helpers.Pace")]  # pacing changes no weight
    main(["fit", *unpaced, f"--trainer.default_root_dir={tmp_path / 'straight'}"])
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *timed, f"--trainer.default_root_dir={run_dir}", *signal_at_step(14)])
    assert stopped.value.code == 143
    main(["fit", *timed, f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last"])
    before, after = (read_metrics(run_dir, v) for v in (0, 1))
    steps_before = [int(r["step"]) for r in before if r.get("val/loss")]
    steps_after = [int(r["step"]) for r in after if r.get("val/loss")]
    assert steps_before and steps_after  # the clock triggered validations on both sides of the stop
    assert max(steps_before) <= 13 < min(steps_after)  # step 14 has index 13 in the rows: none lost or repeated
    a, b = (load_state(d / "checkpoints" / "last.ckpt") for d in (tmp_path / "straight", run_dir))
    weights = [k for k in a if k.startswith("net.")]  # not val_acc_best: it depends on when validations ran
    assert weights and all(torch.equal(a[k], b[k]) for k in weights)


# -- the stop signals from outside, as a person, a scheduler or Kubernetes sends them ---------------------------


def fit_command(run_dir: Path, *args: str) -> list[str]:
    """``python -m tests.cli fit`` of this file's workload into ``run_dir``."""
    return [sys.executable, "-m", "tests.cli", "fit", *COMMON, f"--trainer.default_root_dir={run_dir}", *args]


def start(run_dir: Path, *args: str, environment: dict[str, str] | None = None, **env: str) -> subprocess.Popen:
    return prewarmed.popen(
        fit_command(run_dir, *args),
        cwd=REPO,
        env=environment or cli_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


DDP = ["--trainer.strategy=ddp", "--trainer.devices=2"]
DDP_SPAWN = ["--trainer.strategy=ddp_spawn", "--trainer.devices=2"]
#: ddp_spawn computes what ddp does, bit for bit (the same seeds on each rank, the same all-reduce): one
#: uninterrupted ddp run is the reference of both
STRAIGHT_OF = {"ddp": DDP, "ddp_spawn": DDP}


@pytest.fixture(scope="module")
def straight_multi_process(tmp_path_factory) -> dict[str, Path]:
    """The uninterrupted two-process run a stopped ddp or ddp_spawn run is compared with, trained on first use."""
    runs: dict[str, Path] = {}

    def run(launcher: str) -> Path:
        strategy = STRAIGHT_OF[launcher]
        key = strategy[0]
        if key not in runs:
            run_dir = tmp_path_factory.mktemp("straight") / "run"
            prewarmed.run(fit_command(run_dir, *strategy), cwd=REPO, env=cli_env(), check=True, capture_output=True)
            runs[key] = run_dir
        return runs[key]

    return run  # type: ignore[return-value]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "strategy"),
    [
        pytest.param("SIGINT", [], id="ctrl-c"),
        pytest.param("SIGTERM", DDP, id="sigterm-to-rank-0-of-ddp", marks=pytest.mark.extended),
        pytest.param("SIGTERM", DDP_SPAWN, id="sigterm-to-the-launcher-of-ddp_spawn", marks=pytest.mark.extended),
    ],
)
def test_signal_from_outside_saves_stops_with_its_exit_code_and_resumes_exactly(
    name, strategy, straight_multi_process, tmp_path
):
    """The ddp run is also a newcomer's (no warning filters of the test suite, `srun` on PATH, the model summary
    on): stopped and resumed, no rank prints a line of noise (tests/errors/test_quiet.py). It is started with
    ``max_steps=20``, resumed to its end, and then continued with the larger limit of the others (40): a finished
    ddp run continued equals the uninterrupted one in every value its last.ckpt holds
    (tests/checkpoints/test_continuation.py)."""
    run_dir = tmp_path / "run"
    quiet = strategy == DDP
    environment = newcomer_env_in(tmp_path) if quiet else None
    extra = ["--trainer.enable_model_summary=true"] if quiet else []
    first_limit = ["--trainer.max_steps=20"] if quiet else []
    held = tmp_path / "held"
    process = start(run_dir, *strategy, *extra, *first_limit, *hold_at(6, held), environment=environment)
    wait_for(held.exists, "the run held at step 6", process=process)
    process.send_signal(signal.Signals[name])  # to the launched process only: under ddp, rank 0
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.Signals[name], stderr[-3000:]
    assert f"{name}: saved" in stderr and "--ckpt_path=last" in stderr
    assert "Traceback" not in stderr
    assert not (run_dir / LOCK_FILE).exists()  # the stopped run let go of its directory (multigpu/run/run_lock.py)
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    assert 6 <= saved < (20 if quiet else STEPS)
    resume = [f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last"]

    def launch(*args: str) -> str:  # Lightning's launchers re-run the command: a process of its own
        command = [sys.executable, "-m", "tests.cli", "fit", *COMMON, *strategy, *extra, *args, *resume]
        result = prewarmed.run(command, cwd=REPO, env=environment or cli_env(), capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-6000:]
        return result.stdout + result.stderr

    if not strategy:
        main(["fit", *COMMON, *resume])
        straight = tmp_path / "straight"
        main(["fit", *COMMON, f"--trainer.default_root_dir={straight}"])
    elif quiet:
        assert "preempted: SIGTERM: saved" in stderr
        assert_no_noise(stdout + stderr)
        resumed = launch(*first_limit)
        assert "All distributed processes registered. Starting with 2 processes" in resumed
        assert_no_noise(resumed)
        assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 20
        assert_no_noise(launch())  # continued to 40 steps
        straight = straight_multi_process("ddp")
        assert_same_continuation(run_dir, straight)
    else:
        launch()
        straight = straight_multi_process(strategy[0].rpartition("=")[2])
    assert_same_run(run_dir, straight)


@pytest.mark.slow
def test_second_ctrl_c_stops_at_once_without_saving(tmp_path):
    """Both Ctrl-Cs come while the second step is held, never released: the first waits for the step's end, the
    second does not."""
    run_dir, held = tmp_path / "run", tmp_path / "held"
    hold = hold_at(2, held, release_file=tmp_path / "never")
    process = start(run_dir, "--trainer.limit_val_batches=0", *hold)
    wait_for(held.exists, "the run held at step 2", process=process)
    process.send_signal(signal.SIGINT)
    wait_for(lambda: "received SIGINT" in lines(held), "the first Ctrl-C handled", process=process)
    # another key press, not the same one: over SAME_KEY_PRESS_S after the first, handled before the wait returned
    time.sleep(SAME_KEY_PRESS_S)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-3000:]
    assert "second Ctrl-C" in stderr and "without saving" in stderr
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()


@pytest.mark.parametrize("requeued", [True, False])
def test_a_requeue_from_the_run_writes_the_saved_line_before_the_requeue_ends_it(requeued, tmp_path):
    """``scontrol requeue`` ends the job step at once (SIGTERM to every task): the saved line is out before it runs.
    The test's scontrol does what SLURM does to the process that called it, or fails."""
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    # requeued, it returns only once its caller is gone (kill -0 fails once the ended process is reaped)
    requeue = "kill -TERM $PPID\nwhile kill -0 $PPID 2>/dev/null; do sleep 0.01; done\n"
    fake.write_text("#!/bin/sh\n" + (requeue if requeued else "echo no such job >&2\nexit 1\n"))
    fake.chmod(0o755)
    code = (
        "from types import SimpleNamespace\n"
        "from multigpu.faults.preemption import PreemptionCheckpoint\n"
        "saved = 'SIGUSR1: saved last.ckpt at step 11'\n"
        "print(PreemptionCheckpoint._requeue(SimpleNamespace(loggers=[]), '392', saved))"
    )
    env = cli_env(PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    result = prewarmed.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    saved = "preempted: SIGUSR1: saved last.ckpt at step 11; requeuing SLURM job 392, which resumes from it."
    assert result.stderr.splitlines()[0] == saved, result.stderr
    if requeued:
        assert result.returncode == -signal.SIGTERM and result.stdout == ""  # ended by the requeue, as on SLURM
    else:
        assert result.returncode == 0, result.stderr
        assert "scontrol requeue 392 failed: no such job" in result.stderr  # the warning, with scontrol's reason
        assert result.stdout.startswith("scontrol requeue 392 failed, the job is not requeued; resume with")


# -- atomic checkpoints --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_during_a_checkpoint_write_leaves_the_previous_one_intact(tmp_path):
    """SIGKILL while the checkpoint after ``last.ckpt`` is being written (``best-<step>.ckpt``, which ``last.ckpt``
    becomes another name of, written in the background), with ``$TMPDIR`` on another file system (tmpfs)."""
    staging = Path("/dev/shm") / f"ckpt-test-{os.getpid()}"
    staging.mkdir()
    assert os.stat(staging).st_dev != os.stat(tmp_path).st_dev, "needs TMPDIR on another file system"
    run_dir = tmp_path / "run"
    args = [
        "--trainer.val_check_interval=2",
        "--trainer.check_val_every_n_epoch=null",
        "--trainer.callbacks+=tests.helpers.Ballast",
        "--trainer.callbacks.megabytes=256",
    ]
    # held at step 5 until the kill: the only write after last.ckpt's (step 2) is step 4's
    process = start(run_dir, *args, *hold_at(5, tmp_path / "held"), TMPDIR=str(staging))
    folder = run_dir / "checkpoints"

    def rewriting_last() -> bool:  # last.ckpt exists and its next version is being written beside it
        names = os.listdir(folder) if folder.is_dir() else []
        return "last.ckpt" in names and any(name.startswith(".") and name.endswith(".tmp") for name in names)

    wait_for(rewriting_last, "last.ckpt being rewritten in place", timeout=300, process=process, poll=0.001)
    process.kill()  # a few milliseconds into writing hundreds of megabytes: mid-write
    process.wait()
    partial = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert partial, f"the kill missed the write: {sorted(p.name for p in folder.iterdir())}"
    assert is_intact(folder / "last.ckpt")
    assert torch.load(folder / "last.ckpt", weights_only=False)["global_step"] == 2
    assert list(staging.iterdir()) == []  # nothing was staged in TMPDIR
    staging.rmdir()
    main(
        [
            "fit",
            *COMMON,
            *args,
            f"--trainer.default_root_dir={run_dir}",
            "--ckpt_path=last",
            "--trainer.max_steps=6",
            "--trainer.callbacks.megabytes=1",
        ]
    )
    assert torch.load(folder / "last.ckpt", weights_only=False)["global_step"] == 6
    assert not any(p.name.endswith(".tmp") for p in folder.iterdir())  # the killed write's file is gone


@pytest.mark.slow
def test_damaged_last_checkpoint_resumes_from_the_newest_intact_one(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [
        *COMMON,
        "--trainer.val_check_interval=4",
        "--trainer.check_val_every_n_epoch=null",
        f"--trainer.default_root_dir={run_dir}",
    ]
    main(["fit", *args, "--trainer.max_steps=8"])
    last = run_dir / "checkpoints" / "last.ckpt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])  # as a kill during a non-atomic copy leaves it
    main(["fit", *args, "--ckpt_path=last", "--trainer.max_steps=12"])
    err = capsys.readouterr().err
    assert "is damaged" in err and "best-" in err
    assert torch.load(last, weights_only=False)["global_step"] == 12
