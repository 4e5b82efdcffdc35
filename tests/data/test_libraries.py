"""Streaming libraries' own loaders through the command line (``tests/zoo/streaming.py``): LitData's
``StreamingDataLoader``, which shards itself, is kept as it is and trains; every sample of an epoch is trained once
under ddp (WebDataset's also under fsdp2); a run stopped mid-epoch (SIGTERM, or SIGKILL under ddp with a checkpoint
every step) and resumed ends bit-equal to an uninterrupted one, with LitData (also under fsdp2) and torchdata's
``StatefulDataLoader`` (two workers); WebDataset, which keeps no position, says in one line at a resume (after
SIGTERM or SIGKILL) that it starts its epoch again. Under ddp, validation reads every sample once; shards uneven
among the ranks end the epoch on every rank together with one note, LitData's by its own ``drop_last``. The helpers
here serve the other libraries' modules (Hugging Face ``datasets``, MosaicML streaming); an uninterrupted run is
shared by the proofs of a module that compare with it.

Each library's data is written by its own writer in the test's folder (``litdata.optimize``,
``webdataset.TarWriter``): no download.
"""

from __future__ import annotations

import copy
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from multigpu.checkpoints.sharded import load_sharded_checkpoint
from multigpu.testing import SIGTERM_EXIT, Project, Run, differences
from tests import prewarmed
from tests.conftest import CLI_MODULE, REPO, cli_env
from tests.zoo.streaming import write_shards

#: the libraries are no dependency of the project: CI installs them before it runs the extended suite (.ci/run)
pytestmark = pytest.mark.extended

SAMPLES = 64
BATCH = 4
#: past the first steps, before the end of the first epoch (16 steps on one device, 8 under ddp on 2)
STOP_AT, STEPS = 3, 6
#: WebDataset's tar files: one for each worker of each of the 2 processes
SHARDS = 4
#: samples that do not divide evenly among 2 processes' shards: WebDataset's in 5 tar files
UNEVEN = 60
DDP = ("--trainer.strategy=ddp", "--trainer.devices=2")
FSDP2 = ("--trainer.strategy=fsdp2", "--trainer.devices=2")
#: one epoch and its whole validation; a collective that waits a minute fails the run with every rank's stacks
EPOCH = ("--trainer.max_epochs=1", "--trainer.limit_val_batches=1.0", "--collective_timeout=60")
#: a learning-rate schedule that reads estimated_stepping_batches before the loops are restored (max_epochs set, so
#: Lightning sets up the data to count): a StatefulDataLoader's state must still come back
SCHEDULED = ("--trainer.max_epochs=1", "--model.init_args.decay=true")
MODEL = ("--model=tests.zoo.streaming.IdRegressor", "--model.init_args.dropout=0.1")


def needs(library: str, install: str) -> None:
    pytest.importorskip(library, reason=f"needs {library}: {install}")


def needs_litdata() -> None:
    needs("litdata", "pip install --no-deps litdata, then pip install lightning-utilities filelock boto3 requests")


def written_chunks(tmp_path_factory: pytest.TempPathFactory, samples: int) -> Path:
    needs_litdata()
    folder = tmp_path_factory.mktemp("chunks") / "optimized"
    # in a process of its own: the writer changes the environment of the process it runs in
    write = f"from tests.zoo.streaming import write_chunks; write_chunks({str(folder)!r}, {samples})"
    subprocess.run([sys.executable, "-c", write], cwd=REPO, env=cli_env(), check=True, capture_output=True)
    return folder


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written_chunks(tmp_path_factory, SAMPLES)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    needs("webdataset", "pip install webdataset")
    folder = tmp_path_factory.mktemp("shards")
    write_shards(str(folder), SAMPLES, SHARDS)
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


def uninterrupted_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Run, Path]]:
    """``STEPS`` steps run without a stop, with the prefix of the ids file each rank wrote: one run for each
    project and arguments, shared by the proofs of a module that compare a stopped run with it."""
    runs: dict[tuple[str, ...], tuple[Run, Path]] = {}

    def run(project: Project, *args: str) -> tuple[Run, Path]:
        key = (*project.args, *args)
        if key not in runs:
            folder = tmp_path_factory.mktemp("uninterrupted")
            ids = folder / "ids"
            straight = project.fit(*args, f"--model.init_args.ids_file={ids}", run_dir=folder / "run", max_steps=STEPS)
            runs[key] = straight, ids
        return runs[key]

    return run


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Run, Path]]:
    return uninterrupted_runs(tmp_path_factory)


def assert_resumes_exactly(uninterrupted: Callable[..., tuple[Run, Path]], project: Project, *args: str) -> None:
    """A run stopped by SIGTERM after step ``STOP_AT`` (the engine saves and stops; under ddp at the step the ranks
    agree on) and resumed with ``--ckpt_path=last`` trains the batches the uninterrupted run trains and ends with
    its weights and optimizer state, bit for bit."""
    straight, straight_ids = uninterrupted(project, *args)
    resumed_ids = project.tmp_path / "resumed-ids"
    stop = ("--trainer.callbacks+=multigpu.testing.SignalAtStep", f"--trainer.callbacks.step={STOP_AT}",
            "--trainer.callbacks.signal_name=SIGTERM")  # fmt: skip
    stopped = project.fit(*args, *stop, f"--model.init_args.ids_file={resumed_ids}", check=False, max_steps=STEPS)
    assert stopped.returncode == SIGTERM_EXIT, stopped.describe()
    assert 0 < saved(stopped)["global_step"] < STEPS, stopped.describe()
    resumed = project.fit(
        *args, f"--model.init_args.ids_file={resumed_ids}", "--ckpt_path=last", run_dir=stopped.run_dir, max_steps=STEPS
    )
    assert trained_ids(resumed_ids) == trained_ids(straight_ids), resumed.describe()
    assert_same_end(straight, resumed)


#: a checkpoint every step, so that a kill finds one from a step before
EVERY_STEP = "--checkpoint.every_n_train_steps=1"
#: ``KillAt``'s step and moment: once step ``STOP_AT``'s update is done, before its checkpoint
AFTER_STOP_AT = (STOP_AT, "step")


def killed_mid_epoch(
    project: Project, *args: str, at: tuple[int, str] = AFTER_STOP_AT, run_dir: Path | None = None
) -> tuple[Run, list[list[int]]]:
    """A run with a checkpoint every step (in ``run_dir``, where given), SIGKILLed on every process ``at`` a step and
    moment of ``KillAt``, and the ids each rank trained before the kill."""
    # a session of its own: the kill ends the run's process group, not pytest's
    killable = copy.copy(project)
    killable.runner = partial(prewarmed.run, start_new_session=True)
    ids = f"--model.init_args.ids_file={project.tmp_path / 'ids'}"
    step, moment = at
    kill = ("--trainer.callbacks+=tests.helpers.KillAt", f"--trainer.callbacks.step={step}",
            f"--trainer.callbacks.moment={moment}")  # fmt: skip
    killed = killable.fit(EVERY_STEP, *args, *kill, ids, check=False, max_steps=STEPS, run_dir=run_dir)
    assert killed.returncode == -signal.SIGKILL, killed.describe()
    return killed, trained_ids(project.tmp_path / "ids")


def resume(project: Project, killed: Run, *args: str) -> Run:
    """The killed run resumed from its last checkpoint, appending to the same ids files."""
    ids = f"--model.init_args.ids_file={project.tmp_path / 'ids'}"
    return project.fit(EVERY_STEP, *args, ids, "--ckpt_path=last", run_dir=killed.run_dir, max_steps=STEPS)


def assert_killed_resumes_exactly(
    uninterrupted: Callable[..., tuple[Run, Path]],
    project: Project,
    *args: str,
    kills: tuple[tuple[int, str], ...] = (AFTER_STOP_AT,),
) -> None:
    """SIGKILL mid-epoch (``killed_mid_epoch``) at each of ``kills`` in turn, each killed run resumed by the next:
    ``--ckpt_path=last`` trains on from the step saved, each rank's batches after it and the end bit-equal to an
    uninterrupted run's."""
    straight, straight_ids = uninterrupted(project, *args)
    runs: list[tuple[int, list[list[int]]]] = []  # each killed run's step saved, and the ids trained until its kill
    killed, resumes = None, ()
    for at in kills:
        killed, before = killed_mid_epoch(project, *args, *resumes, at=at, run_dir=killed and killed.run_dir)
        steps = saved(killed)["global_step"]
        # each write ended before the next began: the kill finds the checkpoint of a step before its own
        assert (runs[-1][0] if runs else 0) < steps < at[0], killed.describe()
        runs.append((steps, before))
        resumes = ("--ckpt_path=last",)
    resumed = resume(project, killed, *args)
    for rank, (trained, whole) in enumerate(
        zip(trained_ids(project.tmp_path / "ids"), trained_ids(straight_ids), strict=True)
    ):
        per_step = len(whole) // STEPS  # the global batch where the engine samples, the loader's own where it shards
        kept, start, done = [], 0, 0  # each run's batches up to the step it saved, then the last run's
        for steps, before in runs:
            kept += trained[start : start + (steps - done) * per_step]
            start, done = len(before[rank]), steps
        assert kept + trained[start:] == whole, resumed.describe()
    assert_same_end(straight, resumed)


def assert_same_end(straight: Run, resumed: Run) -> None:
    """Both runs end with the same step, weights, optimizer and schedule state, bit for bit."""
    keys = ("global_step", "state_dict", "optimizer_states", "lr_schedulers")
    found = differences({k: saved(straight)[k] for k in keys}, {k: saved(resumed)[k] for k in keys})
    assert not found, f"{found[:5]}\n{resumed.describe()}"


def saved(run: Run) -> dict[str, Any]:
    """The run's ``last.ckpt``: one file, or the folder of shards fsdp2 writes."""
    path = run.run_dir / "checkpoints" / "last.ckpt"
    return load_sharded_checkpoint(path) if path.is_dir() else run.checkpoint()


def test_litdata_is_kept_as_it_is_and_trains_on_one_device(tmp_path, chunks):
    run = litdata_project(tmp_path, chunks).assert_trains()
    plan = run.plan()
    assert plan["batch_size_means"].startswith("per process (the loader shards itself: LitData")
    assert plan["global_batch"] == BATCH


def assert_epoch_trains_each_sample_once(
    project: Project, *args: str, expected: int = SAMPLES, validated: int = SAMPLES, strategy: tuple[str, ...] = DDP
) -> Run:
    """One epoch under ``strategy`` on 2 processes trains ``expected`` distinct sample ids, none twice, as many
    batches on each rank, and its validation (of every sample, ``val_dataloader``) reads each of the ``validated``
    ids once."""
    ids = project.tmp_path / "ids"
    run = project.fit(*strategy, *EPOCH, *args, f"--model.init_args.ids_file={ids}", max_steps=-1)
    per_rank = trained_ids(ids)
    assert len(per_rank) == 2 and len(per_rank[0]) == len(per_rank[1]), run.describe()
    assert_each_once(per_rank, expected, run)
    assert_each_once(trained_ids(project.tmp_path / "ids-val"), validated, run)
    return run


def assert_each_once(per_rank: list[list[int]], expected: int, run: Run) -> None:
    counts = Counter(i for rank in per_rank for i in rank)
    assert set(counts.values()) == {1}, f"read more than once: {[i for i, n in counts.items() if n > 1]}"
    assert len(counts) == expected, run.describe()


@pytest.mark.slow
def test_litdata_under_ddp_trains_every_sample_of_an_epoch_once(tmp_path, chunks):
    remainder = SAMPLES % (2 * BATCH)  # drop_last: the samples short of a whole batch on every rank
    run = assert_epoch_trains_each_sample_once(litdata_project(tmp_path, chunks), expected=SAMPLES - remainder)
    assert run.plan()["global_batch"] == 2 * BATCH


@pytest.mark.slow
def test_litdata_whose_size_does_not_divide_among_the_ranks_evens_them_out_by_its_drop_last(tmp_path_factory):
    # LitData's drop_last (its default under several processes) gives every rank as many whole batches: of 69
    # samples, the 5 short of a global batch of 2 x 4 are left out; its validation loader (drop_last=False) reads
    # all 69 once, 35 on one rank and 34 on the other
    size = SAMPLES + 5
    project = litdata_project(tmp_path_factory.mktemp("odd"), written_chunks(tmp_path_factory, size))
    run = assert_epoch_trains_each_sample_once(project, expected=size - size % (2 * BATCH), validated=size)
    assert not [note for note in run.notes() if "uneven" in note], run.describe()


@pytest.mark.slow
def test_litdata_resumes_mid_epoch_exactly_on_one_device(tmp_path, uninterrupted, chunks):
    assert_resumes_exactly(uninterrupted, litdata_project(tmp_path, chunks))


@pytest.mark.slow
def test_litdata_resumes_mid_epoch_exactly_under_ddp(tmp_path, uninterrupted, chunks):
    assert_resumes_exactly(uninterrupted, litdata_project(tmp_path, chunks), *DDP)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [(), DDP], ids=["one-device", "ddp"])
def test_litdata_killed_mid_epoch_resumes_from_its_last_checkpoint_exactly(tmp_path, chunks, uninterrupted, processes):
    assert_killed_resumes_exactly(uninterrupted, litdata_project(tmp_path, chunks), *processes)


@pytest.mark.slow
def test_a_stateful_dataloader_with_workers_resumes_mid_epoch_exactly(tmp_path, uninterrupted):
    assert_resumes_exactly(uninterrupted, stateful_project(tmp_path), *SCHEDULED)


@pytest.mark.slow
def test_a_stateful_dataloader_with_workers_resumes_mid_epoch_exactly_under_ddp(tmp_path, uninterrupted):
    assert_resumes_exactly(uninterrupted, stateful_project(tmp_path), *DDP, *SCHEDULED)


@pytest.mark.slow
def test_a_stateful_dataloader_with_workers_killed_mid_epoch_under_ddp_resumes_exactly(tmp_path, uninterrupted):
    assert_killed_resumes_exactly(uninterrupted, stateful_project(tmp_path), *DDP, *SCHEDULED)


def test_a_stateful_dataloader_with_workers_resumes_mid_epoch_exactly_under_fsdp2(tmp_path, uninterrupted):
    """fsdp2 builds the optimizers, whose schedule reads estimated_stepping_batches (the loader handed out), before
    the checkpoint's callback states are restored: the position is given to the loader handed out."""
    assert_resumes_exactly(uninterrupted, stateful_project(tmp_path), *FSDP2, *SCHEDULED)


@pytest.mark.slow
def test_litdata_resumes_mid_epoch_exactly_under_fsdp2(tmp_path, uninterrupted, chunks):
    assert_resumes_exactly(uninterrupted, litdata_project(tmp_path, chunks), *FSDP2)


def webdataset_project(tmp_path: Path, shards: Path) -> Project:
    data = ("--data=tests.zoo.streaming.WebDatasetData", f"--data.init_args.shards={shards}")
    return project(tmp_path, *data, f"--data.init_args.batch_size={BATCH}", "--data.init_args.num_workers=2")


@pytest.mark.slow
def test_webdataset_split_by_node_and_worker_trains_every_sample_of_an_epoch_once_under_ddp(tmp_path, shards):
    assert_epoch_trains_each_sample_once(webdataset_project(tmp_path, shards))


@pytest.mark.slow
def test_webdataset_split_by_node_and_worker_trains_every_sample_of_an_epoch_once_under_fsdp2(tmp_path, shards):
    assert_epoch_trains_each_sample_once(webdataset_project(tmp_path, shards), strategy=FSDP2)


@pytest.fixture(scope="module")
def uneven_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``UNEVEN`` samples in 5 tar files: split by node, rank 0 reads 3 of them and rank 1 reads 2."""
    needs("webdataset", "pip install webdataset")
    folder = tmp_path_factory.mktemp("uneven")
    write_shards(str(folder), UNEVEN, 5)
    return folder


def assert_uneven_epoch_ends_together(project: Project, samples: int) -> None:
    """One epoch under ddp on 2 processes whose ranks hold uneven shares of ``samples``: it ends (a collective that
    waits a minute fails it), every rank trains as many batches, no sample twice, one note names the samples left
    untrained, and validation reads every sample once."""
    ids = project.tmp_path / "ids"
    run = project.fit(*DDP, *EPOCH, f"--model.init_args.ids_file={ids}", max_steps=-1, timeout=300)
    per_rank = trained_ids(ids)
    assert len(per_rank) == 2 and len(per_rank[0]) == len(per_rank[1]), run.describe()
    trained = Counter(i for rank in per_rank for i in rank)
    assert set(trained.values()) == {1}, run.describe()
    [note] = [note for note in run.notes() if "uneven among the processes" in note]
    assert f"{samples - len(trained)} samples, are not trained" in note and samples > len(trained), run.describe()
    assert_each_once(trained_ids(project.tmp_path / "ids-val"), samples, run)


@pytest.mark.slow
def test_webdataset_shards_uneven_among_the_ranks_end_the_epoch_together_and_say_what_is_left(tmp_path, uneven_shards):
    assert_uneven_epoch_ends_together(webdataset_project(tmp_path, uneven_shards), UNEVEN)


@pytest.mark.slow
def test_webdataset_stopped_mid_epoch_says_in_one_line_that_it_restarts_its_epoch(tmp_path, shards):
    """WebDataset keeps no position: a resume mid-epoch says so in one line and trains the epoch from its start."""
    runs, ids = webdataset_project(tmp_path, shards), f"--model.init_args.ids_file={tmp_path / 'ids'}"
    stop = ("--trainer.callbacks+=multigpu.testing.SignalAtStep", f"--trainer.callbacks.step={STOP_AT}",
            "--trainer.callbacks.signal_name=SIGTERM")  # fmt: skip
    stopped = runs.fit(*DDP, *stop, ids, check=False, max_steps=STEPS)
    assert stopped.returncode == SIGTERM_EXIT, stopped.describe()
    before = trained_ids(tmp_path / "ids")
    resumed = runs.fit(*DDP, ids, "--ckpt_path=last", run_dir=stopped.run_dir, max_steps=STEPS)
    restarts = [note for note in resumed.notes() if "starts the epoch again" in note]
    assert len(restarts) == 1, resumed.describe()
    for first, trained in zip(before, trained_ids(tmp_path / "ids"), strict=True):
        again = trained[len(first) :]
        shorter = min(len(first), len(again))
        assert again[:shorter] == first[:shorter], resumed.describe()  # each rank trains its epoch from its start


@pytest.mark.slow
def test_webdataset_killed_mid_epoch_under_ddp_says_in_one_line_that_it_restarts_its_epoch_and_trains_on(
    tmp_path, shards
):
    # no position of its own to resume from: the order after a resume is not the uninterrupted run's
    runs = webdataset_project(tmp_path, shards)
    killed, _ = killed_mid_epoch(runs, *DDP)
    resumed = resume(runs, killed, *DDP)
    restarts = [note for note in resumed.notes() if "starts the epoch again" in note]
    assert len(restarts) == 1, resumed.describe()
    assert saved(resumed)["global_step"] == STEPS, resumed.describe()
