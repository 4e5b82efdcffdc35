"""The scripts in slurm/, submitted with sbatch to a real SLURM cluster (``bash slurm/ci/start_cluster.sh``),
and the launch checks of multigpu/run/checks.py with the environments SLURM 22.05 really sets.

The job tests (marked ``slurm``) run only against that cluster (ClusterName=ci, nodes ``hostname`` and
``localhost`` on this machine) and skip, with the reason, where there is none; with ``CI=true`` a missing or
broken cluster fails them instead.
The GPU scripts run unchanged but for ``ACCELERATOR=cpu`` and sbatch options that fit 2 CPUs: the CI cluster
declares pretend GPUs so that their ``--gres=gpu:N`` lines are accepted.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.checkpoints.sharded import is_sharded_checkpoint, load_sharded_checkpoint
from multigpu.errors import ConfigurationError
from multigpu.facts import RunFacts, environment
from multigpu.run import checks
from tests.conftest import CLI_MODULE, REPO, TINY, TINY_CONFIG, cli_env, load_state, read_metrics, relative_difference
from tests.helpers import hold_at, wait_for
from tests.zoo import stuck

MAX_STEPS = 40  # 16 steps per epoch: the run crosses two epoch ends (validation, best-*.ckpt)
PREEMPT_AFTER = 8  # signal the job once it has done this many steps (held there until the signal came)
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
#: arguments shared by every training job (after the tests' config, which Jobs.submit passes as CONFIG); fp64 so
#: that equal math gives equal weights to ~1e-14
TRAIN_ARGS = [
    f"--trainer.max_steps={MAX_STEPS}",
    "--trainer.max_epochs=100",
    "--trainer.precision=64-true",
    "--progress_bar=none",
]


# -- the cluster ------------------------------------------------------------------------------------------------


@functools.cache
def _slurm_problem() -> str | None:
    """Why the CI cluster cannot be used here, or None when it can."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "SLURM is not installed (no sinfo/sbatch); start one with: sudo bash slurm/ci/start_cluster.sh"
    try:
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=20)
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "the SLURM controller does not answer (scontrol/sinfo timed out)"
    if config.returncode != 0 or nodes.returncode != 0:
        return f"the SLURM controller does not answer: {(config.stderr or nodes.stderr).strip()}"
    if not re.search(r"^ClusterName\s*=\s*ci$", config.stdout, re.MULTILINE):
        return "this is not the CI cluster of slurm/ci/start_cluster.sh (ClusterName=ci); not submitting test jobs"
    states = dict(line.split() for line in nodes.stdout.splitlines() if line.strip())
    ready = [node for node, state in states.items() if state.rstrip("*~#") in ("idle", "mix", "alloc")]
    if len(set(ready)) < 2:
        return f"the CI cluster's two nodes are not up (sinfo: {states}); restart: sudo bash slurm/ci/start_cluster.sh"
    return None


@pytest.fixture(scope="session")
def slurm() -> None:
    problem = _slurm_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but SLURM is not usable: {problem}")
    pytest.skip(problem)


def job_records(job_id: str) -> list[dict[str, str]]:
    """``scontrol show job`` as one dict per job (an array job gives one per task)."""
    result = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"scontrol show job {job_id}: {result.stderr}"
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in result.stdout.splitlines() if line.strip()]


class Jobs:
    """Submits the project's scripts with sbatch (from the project root, as a user would; they run the tests' command
    line, ``CLI_MODULE``), waits for them, and cancels whatever is still queued or running when the test ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.submitted: list[str] = []

    def submit(self, script: str, *sbatch_args: str, **env: str) -> str:
        """``sbatch SBATCH_ARGS SCRIPT`` (or ``--wrap=COMMAND`` as the script) with ENV added to the environment.

        The scripts read CONFIG right after ``fit``: the tests' workload, unless ENV names another config."""
        env = {"CONFIG": str(TINY_CONFIG), "CLI_MODULE": CLI_MODULE, **env}
        # the environment travels with the job (sbatch --export=ALL, the default): values may contain commas
        output = self.folder / ("%x-%A_%a.out" if any(a.startswith("--array") for a in sbatch_args) else "%x-%j.out")
        result = subprocess.run(
            ["sbatch", "--parsable", f"--output={output}", *sbatch_args, script],
            cwd=REPO,
            env=cli_env(**env),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, f"sbatch {script} failed: {result.stderr}"
        job_id = result.stdout.strip().split(";")[0]
        self.submitted.append(job_id)
        return job_id

    def wait(self, job_id: str, timeout: float = 180) -> list[dict[str, str]]:
        """Wait until every record of the job is finished (a requeued job passes through PENDING again)."""
        records: list[dict[str, str]] = []

        def finished() -> bool:
            records[:] = job_records(job_id)
            return bool(records) and all(r["JobState"] in TERMINAL_STATES for r in records)

        try:
            wait_for(finished, f"job {job_id} to finish", timeout, poll=0.5)
        except AssertionError as late:
            subprocess.run(["scancel", job_id], check=False)
            raise AssertionError(f"{late}: {records}\n{self.logs(4000)}") from None
        return records

    def hold(self, job_id: str, held: Path) -> None:
        """Wait until the job's run is held at its step (``hold_at``), failing at once if the job ends first."""

        def held_or_ended() -> bool:
            state = job_records(job_id)[0]["JobState"]
            assert state in ("PENDING", "RUNNING"), f"job {job_id} {state} before its run was held\n{self.logs()}"
            return held.exists()

        wait_for(held_or_ended, f"job {job_id}'s run held at its step", timeout=120, poll=0.2)

    def logs(self, tail: int = 10**9) -> str:
        """The jobs' output files (the last ``tail`` characters of each)."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-tail:]}" for p in sorted(self.folder.glob("*.out")))

    def cancel_all(self) -> None:
        if self.submitted:
            subprocess.run(["scancel", *self.submitted], capture_output=True, check=False)


@pytest.fixture
def jobs(slurm: None, tmp_path: Path) -> Iterator[Jobs]:
    submitted = Jobs(tmp_path)
    yield submitted
    submitted.cancel_all()


def completed(records: list[dict[str, str]], jobs: Jobs) -> None:
    for record in records:
        assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), f"{record}\n{jobs.logs(4000)}"


def final_step(run_dir: Path) -> int:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]


@pytest.fixture(scope="module")
def reference(slurm: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Path]]:
    """The CPU script with 2 tasks (DDP over gloo), run once, uninterrupted: the run every other job must match."""
    folder = tmp_path_factory.mktemp("reference")
    submitted = Jobs(folder)
    run_dir = folder / "run"
    done: list[Path] = []

    def get() -> Path:
        if not done:
            job = submitted.submit(
                "slurm/cpu.sbatch",
                RUN_DIR=str(run_dir),
                EXTRA_ARGS=" ".join(TRAIN_ARGS),
            )
            completed(submitted.wait(job), submitted)
            done.append(run_dir)
        return done[0]

    yield get
    submitted.cancel_all()


# -- the tests --------------------------------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.extended
def test_cpu_script_trains_with_two_tasks(reference: Callable[[], Path]) -> None:
    run_dir = reference()
    log = next((run_dir.parent).glob("*.out")).read_text()
    assert "Starting with 2 processes" in log  # one DDP process per SLURM task
    assert "--trainer.devices=2 --trainer.num_nodes=1" in log  # taken from the allocation
    assert final_step(run_dir) == MAX_STEPS
    assert len(list((run_dir / "checkpoints").glob("best-*.ckpt"))) == 1
    rows = read_metrics(run_dir)
    assert [int(r["step"]) for r in rows if r.get("val/loss")] == [15, 31]  # validation after each epoch
    assert any(r.get("train/loss") for r in rows)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("requeued_by", ["batch script", pytest.param("training process", marks=pytest.mark.extended)])
def test_preempted_job_saves_requeues_and_resumes_exactly(
    jobs: Jobs, reference: Callable[[], Path], requeued_by: str
) -> None:
    """The scripts requeue once every rank has exited; with ``--preemption.requeue=true`` (for one's own
    scripts) rank 0 runs ``scontrol requeue`` itself, which ends the job step at once."""
    run_dir, held = jobs.folder / "run", jobs.folder / "held"
    extra = [*TRAIN_ARGS, *hold_at(PREEMPT_AFTER, held)]
    if requeued_by == "batch script":
        extra.append("--trainer.logger+=lightning.pytorch.loggers.WandbLogger")  # must continue the same wandb run
    else:
        extra.append("--preemption.requeue=true")  # after the script's --preemption.requeue=false: the last wins
    job = jobs.submit("slurm/cpu.sbatch", RUN_DIR=str(run_dir), EXTRA_ARGS=" ".join(extra))
    jobs.hold(job, held)
    # what SLURM does 90 s before the time limit (--signal=SIGUSR1@90): SIGUSR1 to the training processes
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    (record,) = jobs.wait(job, timeout=240)
    completed([record], jobs)
    log = jobs.logs()

    assert record["Restarts"] == "1", log  # requeued once, same job id
    saved = re.findall(r"saved \S+last\.ckpt at step (\d+)", log)
    assert len(saved) == 2, log  # both ranks stopped at the same step boundary
    assert len(set(saved)) == 1 and PREEMPT_AFTER <= int(saved[0]) < MAX_STEPS, saved
    assert "start #2" in log
    assert f"Restoring states from the checkpoint path at {run_dir}/checkpoints/last.ckpt" in log
    if requeued_by == "batch script":
        assert "requeueing job" in log
        # every rank exited by itself with 75 (preempted): the training step was not killed or cancelled (the
        # batch script itself may be: "JOB N CANCELLED ... DUE TO JOB REQUEUE" is its own requeue ending it)
        assert [line for line in log.splitlines() if "srun: error" in line and "exit code 75" not in line] == []
        assert not re.search(r"STEP \S+ ON \S+ CANCELLED", log) and "Terminated" not in log
    else:
        assert f"requeuing SLURM job {job}, which resumes from it" in log  # written before the requeue ends it
        assert re.search(rf"STEP {job}\.0 ON \S+ CANCELLED AT \S+ DUE TO JOB REQUEUE", log)  # SLURM ended it

    # the same run as without the interruption: same steps, same weights
    assert final_step(run_dir) == MAX_STEPS
    reference_state = load_state(reference() / "checkpoints" / "last.ckpt")
    assert relative_difference(reference_state, load_state(run_dir / "checkpoints" / "last.ckpt")) < 1e-9
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["version_0", "version_1"]
    assert int(read_metrics(run_dir, version=1)[-1]["step"]) == MAX_STEPS - 1

    if requeued_by != "batch script":
        return
    # one wandb run across the requeue: both starts used the id kept in the run directory
    wandb_id = (run_dir / "wandb_run_id").read_text().strip()
    starts = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(starts) == 2 and all(p.name.endswith(f"-{wandb_id}") for p in starts), starts


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.extended
def test_a_stuck_task_is_named_with_its_line_and_the_job_ends(jobs: Jobs) -> None:
    """srun leaves the other tasks running when one fails: the report ends the stuck one, so the job ends too."""
    run_dir = jobs.folder / "run"
    model = ["--model=tests.zoo.stuck.SleepyClassifier", "--model.init_args.stuck_at_step=3"]
    stuck_args = [*model, "--collective_timeout=10"]
    job = jobs.submit("slurm/cpu.sbatch", RUN_DIR=str(run_dir), EXTRA_ARGS=" ".join([*TRAIN_ARGS, *stuck_args]))
    started = time.monotonic()
    (record,) = jobs.wait(job, timeout=120)
    log = jobs.logs()
    assert record["JobState"] == "FAILED" and time.monotonic() - started < 90, log
    line = next(i for i, text in enumerate(Path(stuck.__file__).read_text().splitlines(), 1) if "STUCK" in text)
    assert f"Rank 1 did not arrive: it is at step 3, in training_step, at {stuck.__file__}:{line}" in log, log
    assert (run_dir / "stacks" / "rank-0.txt").is_file() and (run_dir / "stacks" / "rank-1.txt").is_file()


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.extended
def test_allocation_that_does_not_match_the_devices_fails_at_once(jobs: Jobs) -> None:
    run_dir = jobs.folder / "run"
    job = jobs.submit("slurm/cpu.sbatch", RUN_DIR=str(run_dir), DEVICES="1", EXTRA_ARGS=" ".join(TRAIN_ARGS))
    (record,) = jobs.wait(job, timeout=90)
    log = jobs.logs()
    assert (record["JobState"], record["ExitCode"]) == ("FAILED", "2:0"), log
    assert "error: SLURM started 2 task(s) on 1 node(s)" in log
    assert "Fix: pass --trainer.devices=2 --trainer.num_nodes=1" in log
    assert "Initializing distributed" not in log  # stopped before any process group
    assert not (run_dir / "checkpoints").exists()


def submit_on_two_nodes(jobs: Jobs, run_dir: Path, extra: list[str]) -> str:
    """slurm/multi_node.sbatch on both nodes of the cluster, one CPU process each."""
    return jobs.submit(
        "slurm/multi_node.sbatch",
        "--ntasks-per-node=1",
        "--gres=gpu:1",
        "--cpus-per-task=1",
        RUN_DIR=str(run_dir),
        ACCELERATOR="cpu",
        EXTRA_ARGS=" ".join(extra),
    )


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.extended
def test_multi_node_script_trains_the_same_model_on_two_nodes(jobs: Jobs, reference: Callable[[], Path]) -> None:
    run_dir = jobs.folder / "run"
    job = submit_on_two_nodes(jobs, run_dir, TRAIN_ARGS)
    (record,) = jobs.wait(job)
    completed([record], jobs)
    log = jobs.logs()
    assert record["NumNodes"] == "2" and "localhost" in record["NodeList"], record  # both nodes of the cluster
    assert "--trainer.devices=1 --trainer.num_nodes=2" in log and "Starting with 2 processes" in log
    assert final_step(run_dir) == MAX_STEPS
    reference_state = load_state(reference() / "checkpoints" / "last.ckpt")
    assert relative_difference(reference_state, load_state(run_dir / "checkpoints" / "last.ckpt")) < 1e-9


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.extended
def test_multi_node_fsdp2_job_preempted_requeues_and_resumes_from_its_sharded_checkpoint(
    jobs: Jobs, reference: Callable[[], Path]
) -> None:
    run_dir, held = jobs.folder / "run", jobs.folder / "held"
    extra = [*TRAIN_ARGS, *hold_at(PREEMPT_AFTER, held), "--trainer.strategy=fsdp2"]  # after the script's ddp
    job = submit_on_two_nodes(jobs, run_dir, extra)
    jobs.hold(job, held)
    subprocess.run(["scancel", "--signal=USR1", job], check=True)  # as SLURM does before a time limit
    (record,) = jobs.wait(job, timeout=240)
    completed([record], jobs)
    log = jobs.logs()
    assert record["NumNodes"] == "2" and record["Restarts"] == "1", log  # both nodes; requeued once
    assert "--trainer.devices=1 --trainer.num_nodes=2" in log
    saved = re.findall(r"saved \S+last\.ckpt at step (\d+)", log)
    assert len(saved) == 2 and len(set(saved)) == 1 and PREEMPT_AFTER <= int(saved[0]) < MAX_STEPS, log
    assert f"Restoring states from the checkpoint path at {run_dir}/checkpoints/last.ckpt" in log
    last = run_dir / "checkpoints" / "last.ckpt"
    assert is_sharded_checkpoint(last) and len(list(last.glob("*.distcp"))) == 2  # one shard per node
    state = load_sharded_checkpoint(last)
    assert state["global_step"] == MAX_STEPS
    reference_state = load_state(reference() / "checkpoints" / "last.ckpt")
    assert relative_difference(reference_state, state["state_dict"]) < 1e-9  # the uninterrupted ddp run's model


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.extended
def test_array_job_runs_every_task(jobs: Jobs) -> None:
    run_root = jobs.folder / "sweep"
    # the script's own --array=0-3%2 and its four default learning rates; one CPU process per task
    job = jobs.submit(
        "slurm/array.sbatch",
        "--cpus-per-task=1",
        RUN_DIR=str(run_root),
        ACCELERATOR="cpu",
        EXTRA_ARGS=" ".join(["--trainer.max_steps=8", "--trainer.limit_val_batches=2"]),
    )
    records = jobs.wait(job, timeout=240)
    completed(records, jobs)
    assert sorted(r["ArrayTaskId"] for r in records) == ["0", "1", "2", "3"]
    for task, lr in enumerate(["0.1", "0.03", "0.01", "0.003"]):
        run_dir = run_root / f"{task}-{lr}"
        assert final_step(run_dir) == 8
        config = (run_dir / "logs" / "version_0" / "config.yaml").read_text()
        assert re.search(rf"^\s+lr: {lr}$", config, re.MULTILINE), config


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.extended
def test_array_task_without_a_sweep_value_is_refused(jobs: Jobs) -> None:
    job = jobs.submit("slurm/array.sbatch", "--array=2", "--cpus-per-task=1", SWEEP="0.1 0.01", ACCELERATOR="cpu")
    (record,) = jobs.wait(job, timeout=60)
    assert (record["JobState"], record["ExitCode"]) == ("FAILED", "2:0")
    assert "error: array task 2 but SWEEP has 2 values. Fix: sbatch --array=0-1" in jobs.logs()


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.extended
def test_torchrun_inside_a_slurm_job(jobs: Jobs) -> None:
    """One torchrun per node under srun: torchrun's ranks count, not SLURM's one task per node."""
    run_dir = jobs.folder / "run"
    torchrun = Path(sys.executable).with_name("torchrun")
    command = (
        f"srun {torchrun} --standalone --nproc_per_node=2 -m tests.cli fit {' '.join(TINY)}"
        " --trainer.max_steps=8 --trainer.limit_val_batches=2 --progress_bar=none"
        f" --trainer.strategy=ddp --trainer.devices=2 --trainer.default_root_dir={run_dir}"
    )
    job = jobs.submit(f"--wrap={command}", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2", "--job-name=trun")
    (record,) = jobs.wait(job, timeout=120)
    completed([record], jobs)
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in jobs.logs()
    assert final_step(run_dir) == 8


# -- the launch checks, in the environments SLURM 22.05 really sets (printed by jobs on the CI cluster) ---------

#: a batch script of `sbatch --nodes=1 --ntasks-per-node=2`: SLURM_PROCID=0 but no SLURM_STEP_ID
BATCH_SCRIPT = {
    "SLURM_JOB_ID": "2",
    "SLURM_JOBID": "2",
    "SLURM_JOB_NAME": "probe.sbatch",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NNODES": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NPROCS": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "vm",
}
#: a task of `srun` in that job
SRUN_TASK = {**BATCH_SCRIPT, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NUM_TASKS": "2"}
DDP_2 = {"accelerator": "cpu", "strategy": "ddp", "devices": 2, "num_nodes": 1}


@pytest.fixture
def slurm_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], None]:
    for key in list(os.environ):
        if key.startswith("SLURM_") or key in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(key)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)

    def apply(env: dict[str, str]) -> None:
        for key, value in env.items():
            monkeypatch.setenv(key, value)

    return apply


def test_batch_script_and_srun_task_are_told_apart(slurm_env: Callable[[dict[str, str]], None]) -> None:
    slurm_env(BATCH_SCRIPT)
    assert environment.in_slurm_batch_script() and not environment.in_slurm_step()
    slurm_env(SRUN_TASK)
    assert environment.in_slurm_step() and not environment.in_slurm_batch_script()
    slurm_env({"SLURM_JOB_NAME": "interactive"})  # salloc's job: Lightning ignores SLURM there
    assert environment.started_by_srun() and not environment.in_slurm_step() and not environment.in_slurm_batch_script()


def test_srun_task_matching_the_devices_passes(slurm_env: Callable[[dict[str, str]], None]) -> None:
    slurm_env(SRUN_TASK)
    checks.check_launch(RunFacts.of(DDP_2))


@pytest.mark.parametrize(
    ("env", "trainer", "message"),
    [
        (BATCH_SCRIPT, DDP_2, "was not started by srun"),
        (SRUN_TASK, {**DDP_2, "devices": 1}, "Fix: pass --trainer.devices=2 --trainer.num_nodes=1"),
        (SRUN_TASK, {**DDP_2, "num_nodes": 2}, "Fix: pass --trainer.devices=2 --trainer.num_nodes=1"),
        (SRUN_TASK, {**DDP_2, "strategy": "ddp_spawn"}, "inside an srun step"),
        ({**SRUN_TASK, "SLURM_JOB_NAME": "interactive"}, DDP_2, "salloc -J train"),
        # `sbatch --ntasks=2` alone: srun's tasks get no SLURM_NTASKS_PER_NODE, which Lightning requires
        ({k: v for k, v in SRUN_TASK.items() if k != "SLURM_NTASKS_PER_NODE"}, DDP_2, "--ntasks-per-node=2"),
    ],
    ids=["batch-without-srun", "devices", "num-nodes", "ddp-spawn", "salloc-interactive", "ntasks-only"],
)
def test_slurm_launch_errors(
    slurm_env: Callable[[dict[str, str]], None], env: dict[str, str], trainer: dict[str, Any], message: str
) -> None:
    slurm_env(env)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        checks.check_launch(RunFacts.of(trainer))


def test_torchrun_inside_an_srun_task_is_not_checked_against_slurm(
    slurm_env: Callable[[dict[str, str]], None],
) -> None:
    # `srun --ntasks-per-node=1 torchrun --nproc_per_node=2`: SLURM has 1 task, torchrun 2 ranks
    slurm_env({**SRUN_TASK, "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "TORCHELASTIC_RUN_ID": "x"})
    checks.check_launch(RunFacts.of(DDP_2))
