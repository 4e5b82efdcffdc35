"""One live run per run directory (multigpu/run/run_lock.py): the lock is taken whole and once, names its holder,
keeps its
heartbeat and goes when its process exits; a live holder refuses a second run, a gone one is taken over with a note;
the ranks of one launch share it. The slow tests run the command: two fits into one directory, and a fit killed
outright that resumes with ``--ckpt_path=last``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from multigpu.errors import ConfigurationError
from multigpu.facts.environment import Launch
from multigpu.faults.processes import process_start
from multigpu.run import run_lock
from multigpu.run.run_lock import LOCK_FILE, TOKEN_ENV, hold_run_dir, read_lock, release_run_dir
from tests import prewarmed
from tests.cli import main
from tests.conftest import REPO, TINY, cli_env, read_metrics


@pytest.fixture(autouse=True)
def _let_go() -> None:
    """Whatever a test holds is let go of after it, and no token of a lock stays in the environment."""
    yield
    release_run_dir()
    os.environ.pop(TOKEN_ENV, None)


def holder(**fields: object) -> dict[str, object]:
    """The record of a live run on this machine: the parent of this process, which outlives the test."""
    parent = os.getppid()
    return {
        "host": socket.gethostname(),
        "machine": run_lock._machine(),
        "pid": parent,
        "process_start": process_start(parent),
        "since": "2030-01-02 03:04:05 UTC",
        "command": "fit",
        "job": None,
        "step": None,
        "start": 0,
        "trial": None,
        "token": "theirs",
        **fields,
    }


def locked(folder: Path, record: dict[str, object], age_s: float = 0.0) -> Path:
    """``folder`` with a lock naming ``record``, last touched ``age_s`` ago."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    path.write_text(json.dumps(record))
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_the_lock_is_created_whole_and_by_one_of_the_runs_starting_together(tmp_path):
    path = tmp_path / LOCK_FILE
    won: list[int] = []
    ready = threading.Barrier(8)

    def start(number: int) -> None:
        ready.wait()
        if run_lock._create(path, {"token": f"run{number}", "pid": number}):
            won.append(number)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert read_lock(path)[0] == {"token": f"run{won[0]}", "pid": won[0]}  # whole: the winner's record
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]  # no temporary file left


def test_a_held_directory_names_its_holder_and_is_let_go_of(tmp_path):
    folder = tmp_path / "new" / "run"
    held = hold_run_dir(folder, "fit")
    record = read_lock(folder / LOCK_FILE)[0]
    assert record["host"] == socket.gethostname() and record["pid"] == os.getpid() and record["command"] == "fit"
    assert record["process_start"] == process_start(os.getpid()) and record["since"]
    assert os.environ[TOKEN_ENV] == record["token"]  # what the ranks Lightning's launcher starts inherit
    assert hold_run_dir(folder, "fit") is held  # the same process asking again
    release_run_dir()
    assert TOKEN_ENV not in os.environ
    assert not (tmp_path / "new").exists()  # the folders it made, empty, went with it
    hold_run_dir(folder, "fit")
    (folder / "written").write_text("a run's file")
    release_run_dir()
    assert sorted(p.name for p in folder.iterdir()) == ["written"]  # a folder a run wrote into stays


def test_a_live_run_refuses_another_naming_itself_and_the_ways_on(tmp_path):
    path = locked(tmp_path / "run", holder())
    before = path.read_text()
    with pytest.raises(ConfigurationError) as refused:
        hold_run_dir(tmp_path / "run", "fit")
    message = str(refused.value)
    assert message.startswith(f"--trainer.default_root_dir={tmp_path / 'run'} is in use by another run: process")
    assert f"process {os.getppid()} on host {socket.gethostname()}, running `fit` since 2030-01-02 03:04:05" in message
    assert "Fix: wait for that run to finish" in message and "--trainer.default_root_dir=<new dir>" in message
    assert "\n" not in message and path.read_text() == before
    with pytest.raises(
        ConfigurationError, match=r"evaluate that run's checkpoints, e.g. --ckpt_path=\S+/run/checkpoints/last.ckpt"
    ):
        hold_run_dir(tmp_path / "run", "validate")  # evaluating its checkpoints stays possible, from elsewhere


def test_a_lock_whose_process_is_gone_is_taken_over_with_a_note(tmp_path, capsys):
    ended = subprocess.Popen(["true"])
    ended.wait()  # it existed, exited and was reaped: its number names no process
    locked(tmp_path / "dead", holder(pid=ended.pid))
    hold_run_dir(tmp_path / "dead", "fit")
    assert read_lock(tmp_path / "dead" / LOCK_FILE)[0]["pid"] == os.getpid()
    note = capsys.readouterr().err
    assert note.startswith(f"note: taking over {tmp_path / 'dead'}: its {LOCK_FILE} named process ")
    assert f"gone (no process {ended.pid} runs on this host)" in note and len(note.strip().splitlines()) == 1
    locked(tmp_path / "reused", holder(process_start=1))  # the number now names a process started later
    hold_run_dir(tmp_path / "reused", "fit")
    assert "is another program now, started after the lock was taken" in capsys.readouterr().err


def test_a_run_looking_at_any_moment_of_a_takeover_finds_a_lock(tmp_path, monkeypatch):
    """A takeover puts its lock in place of the gone one in one step: a lock missing for a moment would be taken,
    with no note, by a run that happens to look then, and the taker would then be refused by its own directory."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    path = locked(tmp_path / "run", holder(pid=ended.pid))
    seen = []

    def looking(change):  # after each change a takeover makes to the folder, another run looks
        def changed(*args, **kwargs):
            result = change(*args, **kwargs)
            seen.append(path.exists())
            return result

        return changed

    monkeypatch.setattr(Path, "unlink", looking(Path.unlink))
    monkeypatch.setattr(os, "replace", looking(os.replace))
    monkeypatch.setattr(os, "link", looking(os.link))
    hold_run_dir(tmp_path / "run", "fit")
    assert read_lock(path)[0]["pid"] == os.getpid()
    assert seen and all(seen), seen


#: a run that takes its run directory once told to go (every run at once), and holds it until its input closes
TAKER = """
import sys
from multigpu.errors import ConfigurationError
from multigpu.run.run_lock import hold_run_dir
print("ready", flush=True)
sys.stdin.readline()
try:
    hold_run_dir(sys.argv[1], "fit")
    print("held", flush=True)
except ConfigurationError:
    print("refused", flush=True)
sys.stdin.read()
"""


def test_runs_taking_over_one_gone_lock_at_once_leave_it_to_one_of_them(tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    path = locked(tmp_path / "run", holder(pid=ended.pid))
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    command = [sys.executable, "-c", TAKER, str(tmp_path / "run")]
    runs = [prewarmed.popen(command, cwd=REPO, env=cli_env(), **pipes) for _ in range(4)]
    for run in runs:
        assert run.stdout.readline() == "ready\n"
    for run in runs:  # all together: each finds the lock gone, and they take it over at the same time
        run.stdin.write("go\n")
        run.stdin.flush()
    outcomes = [run.stdout.readline().strip() for run in runs]
    assert sorted(outcomes) == ["held", "refused", "refused", "refused"]
    assert read_lock(path)[0]["pid"] == runs[outcomes.index("held")].pid
    notes = []
    for run in runs:
        run.stdin.close()
        notes.append(run.stderr.read())
        assert run.wait(timeout=60) == 0
    assert sum("note: taking over" in note for note in notes) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == []  # the lock went with its run; no guard is left


def test_a_lock_from_another_host_is_taken_over_only_without_heartbeat(tmp_path, monkeypatch, capsys):
    elsewhere = holder(host="node-elsewhere", machine="another boot", pid=4242)
    path = locked(tmp_path / "run", elsewhere, age_s=2)
    with pytest.raises(ConfigurationError, match=r"last heartbeat 2 s ago.*after 300 s without heartbeat"):
        hold_run_dir(tmp_path / "run", "fit")
    monkeypatch.setattr(run_lock, "STALE_AFTER_S", 1.0)
    hold_run_dir(tmp_path / "run", "fit")
    assert "named process 4242 on host node-elsewhere" in capsys.readouterr().err
    assert read_lock(path)[0]["pid"] == os.getpid()


def test_the_holder_keeps_its_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    hold_run_dir(tmp_path, "fit")
    path = tmp_path / LOCK_FILE
    os.utime(path, (time.time() - 100, time.time() - 100))
    deadline = time.monotonic() + 10
    while run_lock._age(path) > 50:
        assert time.monotonic() < deadline, "no heartbeat"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("ending", "status"),
    [("", 0), ("raise RuntimeError('a crash')", 1), ("raise SystemExit(143)", 143)],
    ids=["normal", "exception", "stopped"],
)
def test_the_lock_goes_however_its_process_exits(tmp_path, ending, status):
    code = f"from multigpu.run.run_lock import hold_run_dir\nhold_run_dir({str(tmp_path)!r}, 'fit')\n{ending}"
    result = prewarmed.run([sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True)
    assert result.returncode == status, result.stderr
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_command_refused_after_taking_the_directory_leaves_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as refused:
        main(["fit", *TINY, f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={tmp_path / 'none.ckpt'}"])
    assert refused.value.code == 2 and "does not exist" in capsys.readouterr().err
    assert not run_dir.exists() and TOKEN_ENV not in os.environ


def test_the_ranks_of_one_launch_share_its_lock(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_lock, "RANK_WAIT_S", 0.2)
    job = {"job": "SLURM job 7", "step": "step 0", "start": 0}
    rank = Launch(rank=1, **job)
    locked(tmp_path / "a", holder(**job))
    assert hold_run_dir(tmp_path / "a", "fit", rank) is None  # a rank of the same job step: rank 0 holds it
    with pytest.raises(ConfigurationError, match="is in use by another run"):
        hold_run_dir(tmp_path / "a", "fit", Launch(rank=1, job="SLURM job 8", step="step 0"))  # another job's
    assert hold_run_dir(tmp_path / "a", "fit", Launch(rank=1)) is None  # no job to tell: rank 0 decides
    with pytest.raises(ConfigurationError, match="is in use by another run"):
        hold_run_dir(tmp_path / "a", "fit", Launch(rank=0, **job))  # a second command in the same step
    monkeypatch.setenv(TOKEN_ENV, "theirs")
    assert hold_run_dir(tmp_path / "a", "fit") is None  # a rank Lightning's launcher started: same token
    monkeypatch.delenv(TOKEN_ENV)

    requeued = Launch(rank=0, job="SLURM job 7", step="step 0", start=1)
    assert hold_run_dir(tmp_path / "a", "fit", Launch(rank=1, job="SLURM job 7", step="step 0", start=1)) is None
    hold_run_dir(tmp_path / "a", "fit", requeued)  # the old start of a job is gone when it starts again
    assert "gone (an earlier start of SLURM job 7, restart 0; this is restart 1)" in capsys.readouterr().err
    assert read_lock(tmp_path / "a" / LOCK_FILE)[0]["start"] == 1

    trial = f"{tmp_path / 'sweep'} trial 3"
    locked(tmp_path / "trial", holder(trial=trial))
    with pytest.raises(ConfigurationError, match="is in use by another run"):
        hold_run_dir(tmp_path / "trial", "fit", Launch(trial=f"{tmp_path / 'sweep'} trial 4"))
    hold_run_dir(tmp_path / "trial", "fit", Launch(trial=trial))  # the sweep's own lock gave this worker the trial
    assert "an earlier start of sweep" in capsys.readouterr().err


# -- the command: two fits into one directory, and a fit killed outright -----------------------------------------

COMMON = [*TINY, "--model.init_args.dropout=0.2", "--trainer.max_steps=24", "--progress_bar=none"]


def start_paused(run_dir: Path, step: int, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    """``fit`` into ``run_dir``, pausing after ``step`` until the returned resume file exists."""
    paused, resume = run_dir.parent / "paused", run_dir.parent / "resume"
    command = [sys.executable, "-m", "tests.cli", "fit", *COMMON, f"--trainer.default_root_dir={run_dir}", *args]
    command += ["--trainer.callbacks+=tests.helpers.PauseAtStep", f"--trainer.callbacks.step={step}"]
    command += [f"--trainer.callbacks.paused_file={paused}", f"--trainer.callbacks.resume_file={resume}"]
    process = prewarmed.popen(
        command, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while not paused.exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never reached its pause"
        time.sleep(0.05)
    return process, paused, resume


@pytest.mark.slow
def test_a_second_fit_into_a_live_run_directory_is_refused_and_the_first_finishes(tmp_path, run_cli):
    run_dir = tmp_path / "run"
    first, _, resume = start_paused(run_dir, 3)
    second = run_cli("fit", *COMMON, f"--trainer.default_root_dir={run_dir}", check=False)
    assert second.returncode == 2, second.stderr[-3000:]
    error = second.stderr.strip()
    assert len(error.splitlines()) == 1 and error.startswith(f"error: --trainer.default_root_dir={run_dir} is in use")
    assert f"process {first.pid} on host {socket.gethostname()}, running `fit` since " in error
    assert "Fix: wait for that run to finish" in error and "--trainer.default_root_dir=<new dir>" in error
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["version_0"]  # the second wrote nothing
    resume.touch()
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 24
    assert list((run_dir / "checkpoints").glob("best-*.ckpt"))
    assert not (run_dir / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_fit_killed_outright_resumes_with_ckpt_path_last(tmp_path, run_cli):
    run_dir = tmp_path / "run"
    every_8 = ["--trainer.val_check_interval=8", "--trainer.check_val_every_n_epoch=null"]
    killed, _, _ = start_paused(run_dir, 10, *every_8)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 8
    killed.send_signal(signal.SIGKILL)  # as a node failure or the out-of-memory killer ends it: no exit handler
    killed.wait(timeout=60)
    assert read_lock(run_dir / LOCK_FILE)[0]["pid"] == killed.pid  # left behind
    resumed = run_cli("fit", *COMMON, *every_8, f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last")
    notes = [line for line in resumed.stderr.splitlines() if line.startswith("note: taking over")]
    assert len(notes) == 1 and f"named process {killed.pid} on host" in notes[0], resumed.stderr[-3000:]
    assert f"gone (no process {killed.pid} runs on this host)" in notes[0]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 24
    steps = [int(row["step"]) for row in read_metrics(run_dir, 1)]
    assert steps and min(steps) >= 8  # the second start continued from step 8
    assert not (run_dir / LOCK_FILE).exists()
