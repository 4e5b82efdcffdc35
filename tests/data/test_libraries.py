"""Streaming libraries' own loaders through the command line (``tests/zoo/streaming.py``): LitData's
``StreamingDataLoader``, which shards itself, is kept as it is and trains; every sample of an epoch is trained once
under ddp; a run stopped mid-epoch and resumed ends bit-equal to an uninterrupted one, with LitData and with torchdata's
``StatefulDataLoader`` (two workers), whose state every rank saves and gets back before its first batch.

The chunks are written by ``litdata.optimize`` in the test's own folder: no download.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from multigpu.testing import SIGTERM_EXIT, Project, differences
from tests import prewarmed
from tests.conftest import CLI_MODULE, REPO, cli_env

#: the libraries are no dependency of the project: CI installs them before it runs the extended suite (.ci/run)
pytestmark = pytest.mark.extended

SAMPLES = 64
BATCH = 4
#: past the first steps, before the end of the first epoch (16 steps on one device, 8 under ddp on 2)
STOP_AT, STEPS = 3, 6
DDP = ("--trainer.strategy=ddp", "--trainer.devices=2")
MODEL = ("--model=tests.zoo.streaming.IdRegressor", "--model.init_args.dropout=0.1")


def needs(library: str, install: str) -> None:
    pytest.importorskip(library, reason=f"needs {library}: {install}")


def needs_litdata() -> None:
    needs("litdata", "pip install --no-deps litdata, then pip install lightning-utilities filelock boto3 requests")


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    needs_litdata()
    folder = tmp_path_factory.mktemp("chunks") / "optimized"
    # in a process of its own: the writer changes the environment of the process it runs in
    write = f"from tests.zoo.streaming import write_chunks; write_chunks({str(folder)!r}, {SAMPLES})"
    subprocess.run([sys.executable, "-c", write], cwd=REPO, env=cli_env(), check=True, capture_output=True)
    return folder


def project(tmp_path: Path, *args: str) -> Project:
    return Project(REPO, tmp_path, [*MODEL, *args], cli=CLI_MODULE, env=cli_env(), runner=prewarmed.run)


def litdata_project(tmp_path: Path, chunks: Path) -> Project:
    data = ("--data=tests.zoo.streaming.LitStreamData", f"--data.init_args.input_dir={chunks}")
    return project(tmp_path, *data, f"--data.init_args.batch_size={BATCH}")


def stateful_project(tmp_path: Path) -> Project:
    needs("torchdata", "pip install --no-deps torchdata")
    data = ("--data=tests.zoo.streaming.StatefulData", f"--data.init_args.size={SAMPLES}")
    return project(tmp_path, *data, f"--data.init_args.batch_size={BATCH}", "--data.init_args.num_workers=2")


def trained_ids(prefix: Path) -> list[list[int]]:
    """The ids of every batch each rank trained, in rank order (``IdRegressor``'s ``ids_file``)."""
    files = sorted(prefix.parent.glob(f"{prefix.name}.*"))
    return [[int(i) for line in file.read_text().splitlines() for i in line.split()] for file in files]


def assert_resumes_exactly(project: Project, *args: str) -> None:
    """A run stopped by SIGTERM after step ``STOP_AT`` (the engine saves and stops; under ddp at the step the ranks
    agree on) and resumed with ``--ckpt_path=last`` trains the batches the uninterrupted run trains and ends with
    its weights and optimizer state, bit for bit."""
    straight_ids, resumed_ids = project.tmp_path / "straight-ids", project.tmp_path / "resumed-ids"
    straight = project.fit(*args, f"--model.init_args.ids_file={straight_ids}", max_steps=STEPS)
    stop = ("--trainer.callbacks+=multigpu.testing.SignalAtStep", f"--trainer.callbacks.step={STOP_AT}",
            "--trainer.callbacks.signal_name=SIGTERM")  # fmt: skip
    stopped = project.fit(*args, *stop, f"--model.init_args.ids_file={resumed_ids}", check=False, max_steps=STEPS)
    assert stopped.returncode == SIGTERM_EXIT, stopped.describe()
    assert 0 < stopped.checkpoint()["global_step"] < STEPS, stopped.describe()
    resumed = project.fit(
        *args, f"--model.init_args.ids_file={resumed_ids}", "--ckpt_path=last", run_dir=stopped.run_dir, max_steps=STEPS
    )
    assert trained_ids(resumed_ids) == trained_ids(straight_ids), resumed.describe()
    keys = ("global_step", "state_dict", "optimizer_states", "lr_schedulers")
    found = differences({k: straight.checkpoint()[k] for k in keys}, {k: resumed.checkpoint()[k] for k in keys})
    assert not found, f"{found[:5]}\n{resumed.describe()}"


def test_litdata_is_kept_as_it_is_and_trains_on_one_device(tmp_path, chunks):
    run = litdata_project(tmp_path, chunks).assert_trains()
    plan = run.plan()
    assert plan["batch_size_means"].startswith("per process (the loader shards itself: LitData")
    assert plan["global_batch"] == BATCH


@pytest.mark.slow
def test_litdata_under_ddp_trains_every_sample_of_an_epoch_once(tmp_path, chunks):
    ids = tmp_path / "ids"
    run = litdata_project(tmp_path, chunks).fit(*DDP, "--trainer.max_epochs=1", f"--model.init_args.ids_file={ids}",
                                                max_steps=-1)  # fmt: skip
    per_rank = trained_ids(ids)
    counts = Counter(i for rank in per_rank for i in rank)
    assert len(per_rank) == 2 and len(per_rank[0]) == len(per_rank[1]), run.describe()
    assert set(counts.values()) == {1}, f"trained more than once: {[i for i, n in counts.items() if n > 1]}"
    remainder = SAMPLES % (2 * BATCH)  # drop_last: the samples short of a whole batch on every rank
    assert len(counts) == SAMPLES - remainder and set(counts) <= set(range(SAMPLES))
    assert run.plan()["global_batch"] == 2 * BATCH


@pytest.mark.slow
def test_litdata_resumes_mid_epoch_exactly_on_one_device(tmp_path, chunks):
    assert_resumes_exactly(litdata_project(tmp_path, chunks))


@pytest.mark.slow
def test_litdata_resumes_mid_epoch_exactly_under_ddp(tmp_path, chunks):
    assert_resumes_exactly(litdata_project(tmp_path, chunks), *DDP)


@pytest.mark.slow
def test_a_stateful_dataloader_with_workers_resumes_mid_epoch_exactly(tmp_path):
    # the learning-rate schedule reads estimated_stepping_batches before the loops are restored (max_epochs set,
    # so Lightning sets up the data to count): the loader's state must still come back
    assert_resumes_exactly(stateful_project(tmp_path), "--trainer.max_epochs=1", "--model.init_args.decay=true")


@pytest.mark.slow
def test_a_stateful_dataloader_with_workers_resumes_mid_epoch_exactly_under_ddp(tmp_path):
    assert_resumes_exactly(stateful_project(tmp_path), *DDP, "--trainer.max_epochs=1", "--model.init_args.decay=true")
