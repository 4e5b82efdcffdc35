"""The GPT's pipeline across the two nodes of the CI cluster (``bash slurm/ci/start_cluster.sh``; see
tests/workflows/test_slurm.py), each run against one device in fp64 (every training-loss and validation row, and
the final weights):

- ``slurm/multi_node.sbatch --trainer.strategy=pipeline`` with 2 tasks per node: 2 stages, one per node, each
  sharded with FSDP2 over its node's 2 tasks (pipeline x FSDP2 on 4 processes, stages talking across nodes);
- the three dimensions at once, 2 stages x 2 data-parallel x 2 tensor-parallel = 8 processes: one torchrun of 2
  processes per task (a node of the CI cluster has 2 CPUs, and the template starts no more CPU processes per node
  than cores), the first node's 4 processes stage 0, the second's stage 1.

The two jobs are submitted together (the cluster runs them one after the other) and one device trains the
reference in this process meanwhile. It lives beside the GPT's other tests; the SLURM machinery is
test_slurm.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from multigpu.checkpoints.sharded import is_sharded_checkpoint, load_sharded_checkpoint
from tests.conftest import load_state, relative_difference
from tests.examples.test_gpt_pipeline import CLIPPED, RUN, assert_same_rows, fit_in_process, rows
from tests.workflows.test_slurm import Jobs, completed, slurm  # noqa: F401  (fixture)
from tests.workflows.test_torchrun import torchrun_command

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.extended]

#: 2 nodes x 2 tasks: the mesh (pipeline, data_parallel, tensor_parallel) = (2, 2, 1) numbers the ranks node by
#: node, so stage 0 is the first node's two tasks and stage 1 the second's; FSDP2 gathers within a node
PIPELINE_X_FSDP2 = ["--trainer.strategy=pipeline", "--pipeline.data_parallel_size=2", "--pipeline.micro_batches=2"]
#: 4 torchruns of 2 processes (torchrun node K = SLURM task K, ranks 2K and 2K + 1): mesh (2, 2, 2)
PIPELINE_3D = [
    *PIPELINE_X_FSDP2,
    "--pipeline.tensor_parallel_size=2",
    "--trainer.devices=2",
    "--trainer.num_nodes=4",
]


def submit_3d(jobs: Jobs, run_dir: Path) -> str:
    """One torchrun per SLURM task, its node rank the task's rank, the first node of the job the rendezvous."""
    args = " ".join([*RUN, *CLIPPED, *PIPELINE_3D, f"--trainer.default_root_dir={run_dir}"])
    torchrun = " ".join(torchrun_command())
    per_task = (
        f"exec {torchrun} --nnodes=4 --nproc_per_node=2 --node_rank=$SLURM_PROCID"
        " --master_addr=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)"
        f" --master_port=$((15000 + SLURM_JOB_ID % 10000)) -m src.cli fit {args}"
    )
    return jobs.submit(
        f"--wrap=srun bash -c '{per_task}'",
        "--partition=gpu",  # both nodes
        "--nodes=2",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        "--job-name=pipeline-3d",
    )


@pytest.fixture(scope="module")
def runs(slurm: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:  # noqa: F811
    folder = tmp_path_factory.mktemp("pipeline_slurm")
    jobs = Jobs(folder)
    dirs = {name: folder / name for name in ("single", "fsdp2", "3d", "fsdp2_log", "3d_log")}
    fsdp2 = jobs.submit(
        "slurm/multi_node.sbatch",
        "--ntasks-per-node=2",
        "--gres=gpu:2",
        "--cpus-per-task=1",
        CONFIG="",  # the test's settings are all flags (RUN), as in tests/examples/test_gpt_pipeline.py
        RUN_DIR=str(dirs["fsdp2"]),
        ACCELERATOR="cpu",
        EXTRA_ARGS=" ".join([*RUN, *CLIPPED, *PIPELINE_X_FSDP2]),  # after the script's ddp: the last wins
    )
    three_d = submit_3d(jobs, dirs["3d"])
    try:
        fit_in_process(*CLIPPED, f"--trainer.default_root_dir={dirs['single']}")  # while the jobs run
        for job, name in ((fsdp2, "fsdp2"), (three_d, "3d")):
            (record,) = jobs.wait(job, timeout=300)
            completed([record], jobs)
            assert record["NumNodes"] == "2" and record["NumTasks"] == "4", record  # both nodes, 2 tasks each
            dirs[f"{name}_log"] = next(folder.glob(f"*-{job}.out"))
        yield dirs
    finally:
        jobs.cancel_all()


def assert_trains_the_model_one_device_trains(run_dir: Path, single: Path, shards: int) -> None:
    assert_same_rows(run_dir, single)  # every training loss and validation row, to 1e-9
    assert set(rows(run_dir, "val/loss")) == {"2", "5"}
    last = run_dir / "checkpoints" / "last.ckpt"
    assert is_sharded_checkpoint(last) and len(list(last.glob("*.distcp"))) == shards  # one shard per rank
    whole = load_sharded_checkpoint(last)
    assert whole["global_step"] == 8
    assert relative_difference(load_state(single / "checkpoints" / "last.ckpt"), whole["state_dict"]) < 1e-9


def test_pipeline_stages_on_two_nodes_sharded_over_their_tasks_train_the_model_one_device_trains(runs):
    log = runs["fsdp2_log"].read_text()
    assert "--trainer.devices=2 --trainer.num_nodes=2" in log and "Starting with 4 processes" in log
    assert "pipeline_stages                 2" in log and "layers_per_stage                2, 2" in log
    assert_trains_the_model_one_device_trains(runs["fsdp2"], runs["single"], shards=4)


def test_pipeline_x_fsdp2_x_tensor_parallel_on_8_processes_trains_the_model_one_device_trains(runs):
    log = runs["3d_log"].read_text()
    assert "Initializing distributed: GLOBAL_RANK: 7, MEMBER: 8/8" in log
    assert "pipeline_stages                 2" in log and "layers_per_stage                2, 2" in log
    assert_trains_the_model_one_device_trains(runs["3d"], runs["single"], shards=8)
