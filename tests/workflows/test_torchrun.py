"""``torchrun -m tests.cli fit``: one node with 2 processes, and 2 "nodes" (two torchrun launchers on loopback).

Both must train the same model as one process: the data order does not depend on the world size, and in
fp64 the weights agree to ~1e-14 after the same number of steps.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests import prewarmed
from tests.cli import main
from tests.conftest import REPO, TINY, cli_env, load_state, relative_difference

#: the one-process reference is shared by both tests: one worker trains it once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_torchrun")]

MAX_STEPS = 24
ARGS = [
    *TINY,
    f"--trainer.max_steps={MAX_STEPS}",
    "--trainer.max_epochs=100",
    "--trainer.precision=64-true",
    "--progress_bar=none",
]


def torchrun_command() -> list[str]:
    """``torchrun`` of this Python environment (the same program as ``python -m torch.distributed.run``)."""
    executable = Path(sys.executable).with_name("torchrun")
    return [str(executable)] if executable.is_file() else [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def finish(process: subprocess.Popen, timeout: int = 300) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"timed out:\n{output[-6000:]}") from None
    assert process.returncode == 0, f"exit status {process.returncode}:\n{output[-6000:]}"
    return output


def start(command: list[str]) -> subprocess.Popen:
    # cli_env drops SLURM_* variables: inside a SLURM job torchrun still wins (Lightning checks it first),
    # but the tests should not depend on where they run
    return prewarmed.popen(
        command, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The reference: one process, no torchrun (trained in this one)."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    main(["fit", *ARGS, "--trainer.devices=1", f"--trainer.default_root_dir={run_dir}"])
    yield run_dir


def test_torchrun_two_processes_on_one_node(tmp_path: Path, single_process: Path) -> None:
    run_dir = tmp_path / "run"
    output = finish(
        start(
            [
                *torchrun_command(),
                "--standalone",  # one node: a private rendezvous on a free local port
                "--nproc_per_node=2",
                "-m",
                "tests.cli",
                "fit",
                *ARGS,
                "--trainer.strategy=ddp",
                "--trainer.devices=2",
                f"--trainer.default_root_dir={run_dir}",
            ]
        )
    )
    # torchrun started both processes; Lightning joined them instead of launching its own
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in output
    checkpoint = last_checkpoint(run_dir)
    assert checkpoint["global_step"] == MAX_STEPS
    assert (
        relative_difference(load_state(single_process / "checkpoints" / "last.ckpt"), checkpoint["state_dict"]) < 1e-9
    )


def test_torchrun_two_nodes_on_loopback(tmp_path: Path, single_process: Path) -> None:
    run_dir = tmp_path / "run"  # shared by both "nodes", like a cluster file system
    port = free_port()
    launchers = [
        start(
            [
                *torchrun_command(),
                "--nnodes=2",
                f"--node_rank={node_rank}",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",  # on a cluster: the first node's address
                f"--master_port={port}",
                "-m",
                "tests.cli",
                "fit",
                *ARGS,
                "--trainer.strategy=ddp",
                "--trainer.devices=1",
                "--trainer.num_nodes=2",
                f"--trainer.default_root_dir={run_dir}",
            ]
        )
        for node_rank in (0, 1)
    ]
    outputs = [finish(launcher) for launcher in launchers]
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2" in outputs[0]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    checkpoint = last_checkpoint(run_dir)
    assert checkpoint["global_step"] == MAX_STEPS
    assert (
        relative_difference(load_state(single_process / "checkpoints" / "last.ckpt"), checkpoint["state_dict"]) < 1e-9
    )
