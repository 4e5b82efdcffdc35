"""MosaicML's streaming library (``mosaicml-streaming``), which the engine does not name, through the command line
(``tests/zoo/mosaic.py``): shards written by its ``MDSWriter``, read by its ``StreamingDataset`` in its
``StreamingDataLoader``. It shards itself by torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``),
which the engine sets in every process however it was launched; its loader has a state of its own, which the engine
saves for every rank. Every sample of an epoch is trained once under ddp, and a run stopped mid-epoch (SIGTERM, or
SIGKILL under ddp) resumes bit for bit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from multigpu.testing import SIGTERM_EXIT, Project
from tests.conftest import REPO, cli_env
from tests.data.test_libraries import (
    BATCH,
    DDP,
    SAMPLES,
    assert_epoch_trains_each_sample_once,
    assert_killed_resumes_exactly,
    assert_resumes_exactly,
    project,
    uninterrupted_runs,
)
from tests.zoo.mosaic import import_streaming

#: the library is no dependency of the project: CI installs it before it runs the extended suite (.ci/run); its
#: runs pick a shared-memory prefix per machine without a lock, so two starting at once in two pytest workers can
#: take the same one (docs/data.md): one worker runs them, one after another
pytestmark = [pytest.mark.extended, pytest.mark.xdist_group("test_mosaic")]

INSTALL = "the install line of docs/data.md"


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import_streaming()
    except ImportError as missing:
        pytest.skip(f"needs mosaicml-streaming ({missing}): {INSTALL}")
    folder = tmp_path_factory.mktemp("mds") / "data"
    write = f"from tests.zoo.mosaic import write_mds; write_mds({str(folder)!r}, {SAMPLES})"
    subprocess.run([sys.executable, "-c", write], cwd=REPO, env=cli_env(), check=True, capture_output=True)
    return folder


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory):
    return uninterrupted_runs(tmp_path_factory)


def mosaic_project(tmp_path: Path, shards: Path) -> Project:
    data = ("--data=tests.zoo.mosaic.MosaicData", f"--data.init_args.local={shards}")
    return project(tmp_path, *data, f"--data.init_args.batch_size={BATCH}")


def test_mosaic_streaming_is_kept_as_it_is_and_trains_on_one_device(tmp_path, shards):
    run = mosaic_project(tmp_path, shards).assert_trains()
    assert run.plan()["batch_size_means"].startswith("per process (the loader shards itself: MosaicML streaming")


@pytest.mark.slow
def test_mosaic_streaming_under_ddp_trains_every_sample_of_an_epoch_once(tmp_path, shards):
    assert_epoch_trains_each_sample_once(mosaic_project(tmp_path, shards))


@pytest.mark.slow
def test_mosaic_streaming_resumes_mid_epoch_exactly_on_one_device(tmp_path, uninterrupted, shards):
    assert_resumes_exactly(uninterrupted, mosaic_project(tmp_path, shards))


@pytest.mark.slow
def test_mosaic_streaming_resumes_mid_epoch_exactly_under_ddp(tmp_path, uninterrupted, shards):
    assert_resumes_exactly(uninterrupted, mosaic_project(tmp_path, shards), *DDP)


@pytest.mark.slow
def test_mosaic_streaming_killed_mid_epoch_under_ddp_resumes_exactly(tmp_path, uninterrupted, shards):
    assert_killed_resumes_exactly(uninterrupted, mosaic_project(tmp_path, shards), *DDP)


@pytest.mark.slow
def test_mosaic_streaming_in_a_plain_loader_says_at_a_resume_that_it_starts_its_epoch_again(tmp_path, shards):
    """Its dataset's position needs the count of samples trained (``state_dict(num_samples, from_beginning)``),
    which its own ``StreamingDataLoader`` keeps and a plain ``DataLoader`` does not: the resume says so in one line."""
    runs = mosaic_project(tmp_path, shards)
    stop = ("--trainer.callbacks+=multigpu.testing.SignalAtStep", "--trainer.callbacks.step=3",
            "--trainer.callbacks.signal_name=SIGTERM")  # fmt: skip
    stopped = runs.fit("--data.init_args.plain_loader=true", *stop, check=False, max_steps=6)
    assert stopped.returncode == SIGTERM_EXIT, stopped.describe()
    resumed = runs.fit("--data.init_args.plain_loader=true", "--ckpt_path=last", run_dir=stopped.run_dir, max_steps=6)
    restarts = [note for note in resumed.notes() if "starts the epoch again" in note]
    assert len(restarts) == 1 and "its library's own does" in restarts[0], resumed.describe()
