"""Hugging Face ``datasets`` through the command line (``tests/zoo/streaming.py``): a map-style ``Dataset``
(``from_dict``, torch format) in a plain loader, which the engine samples, and an ``IterableDataset`` of shards split
by node with ``split_dataset_by_node``, whose state after each batch every rank saves (in a plain loader, or in
torchdata's ``StatefulDataLoader`` with workers). Every sample of an epoch is trained once under ddp; a run stopped
mid-epoch (SIGTERM, or SIGKILL under ddp) resumes bit for bit, the map-style one also on one device and under fsdp2,
the stream also under fsdp2 and, in a ``StatefulDataLoader`` with workers, after two kills; a stream uneven among the
ranks ends the epoch on every rank together with one note. The data is written by ``Dataset.from_dict`` in memory:
no download."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import DataLoader, IterableDataset

from multigpu.data.libraries import StatePerBatch
from multigpu.testing import Project
from tests.data.test_libraries import (
    BATCH,
    DDP,
    FSDP2,
    SAMPLES,
    assert_epoch_trains_each_sample_once,
    assert_killed_resumes_exactly,
    assert_resumes_exactly,
    assert_uneven_epoch_ends_together,
    needs,
    project,
    uninterrupted_runs,
)

#: the library is no dependency of the project: CI installs it before it runs the extended suite (.ci/run)
pytestmark = pytest.mark.extended

#: samples that do not divide evenly among 2 processes' shards (in 4 shards)
UNEVEN_HF = 65
#: a Hugging Face stream read by torchdata's StatefulDataLoader with 2 workers (2 of its 4 shards each, per rank)
STATEFUL_WORKERS = ("--data.init_args.stateful=true", "--data.init_args.num_workers=2")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory):
    return uninterrupted_runs(tmp_path_factory)


def hf_project(tmp_path: Path, data: str, *args: str) -> Project:
    needs("datasets", "pip install datasets")
    return project(tmp_path, f"--data=tests.zoo.streaming.{data}", f"--data.init_args.size={SAMPLES}",
                   f"--data.init_args.batch_size={BATCH}", *args)  # fmt: skip


def test_a_hugging_face_dataset_in_a_plain_loader_trains_on_one_device(tmp_path):
    hf_project(tmp_path, "HFMapData").assert_trains()


@pytest.mark.slow
def test_a_hugging_face_dataset_under_ddp_trains_every_sample_of_an_epoch_once(tmp_path):
    run = assert_epoch_trains_each_sample_once(hf_project(tmp_path, "HFMapData"))
    assert run.plan()["global_batch"] == BATCH  # the engine samples it: the batch is the global one


@pytest.mark.slow
def test_a_hugging_face_dataset_resumes_mid_epoch_exactly(tmp_path, uninterrupted):
    assert_resumes_exactly(uninterrupted, hf_project(tmp_path, "HFMapData"))


@pytest.mark.slow
def test_a_hugging_face_dataset_resumes_mid_epoch_exactly_under_ddp(tmp_path, uninterrupted):
    assert_resumes_exactly(uninterrupted, hf_project(tmp_path, "HFMapData"), *DDP)


@pytest.mark.slow
def test_a_hugging_face_dataset_killed_mid_epoch_under_ddp_resumes_exactly(tmp_path, uninterrupted):
    assert_killed_resumes_exactly(uninterrupted, hf_project(tmp_path, "HFMapData"), *DDP)


@pytest.mark.slow
def test_a_hugging_face_dataset_resumes_mid_epoch_exactly_under_fsdp2(tmp_path, uninterrupted):
    assert_resumes_exactly(uninterrupted, hf_project(tmp_path, "HFMapData"), *FSDP2)


@pytest.mark.slow
def test_a_hugging_face_stream_split_by_node_trains_every_sample_of_an_epoch_once_under_ddp(tmp_path):
    run = assert_epoch_trains_each_sample_once(hf_project(tmp_path, "HFStreamData"))
    assert not run.notes(), run.describe()


@pytest.mark.slow
def test_a_hugging_face_stream_split_by_node_resumes_mid_epoch_exactly_under_ddp(tmp_path, uninterrupted):
    # Lightning draws a batch ahead from a loader without a length: the state saved is the one after the batches
    # trained, which a resume gives each rank back
    assert_resumes_exactly(uninterrupted, hf_project(tmp_path, "HFStreamData"), *DDP)


@pytest.mark.slow
def test_a_hugging_face_stream_split_by_node_killed_mid_epoch_under_ddp_resumes_exactly(tmp_path, uninterrupted):
    assert_killed_resumes_exactly(uninterrupted, hf_project(tmp_path, "HFStreamData"), *DDP)


@pytest.mark.slow
def test_a_hugging_face_stream_in_a_stateful_dataloader_with_workers_trains_each_sample_once_under_ddp(tmp_path):
    needs("torchdata", "pip install --no-deps torchdata")
    assert_epoch_trains_each_sample_once(hf_project(tmp_path, "HFStreamData", *STATEFUL_WORKERS))


@pytest.mark.slow
def test_a_hugging_face_stream_in_a_stateful_dataloader_with_workers_resumes_mid_epoch_exactly_under_ddp(
    tmp_path, uninterrupted
):
    # the stream shards itself: torchdata's loader saves each worker's position in the stream
    needs("torchdata", "pip install --no-deps torchdata")
    assert_resumes_exactly(uninterrupted, hf_project(tmp_path, "HFStreamData", *STATEFUL_WORKERS), *DDP)


@pytest.mark.slow
def test_a_hugging_face_stream_in_a_stateful_dataloader_with_workers_killed_mid_epoch_under_ddp_resumes_exactly(
    tmp_path, uninterrupted
):
    # killed while step 2's checkpoint is written: the run resumes from step 1, whose state holds the second worker's
    # start (it has yielded no batch yet), as the workers' copy of the stream told it
    needs("torchdata", "pip install --no-deps torchdata")
    project = hf_project(tmp_path, "HFStreamData", *STATEFUL_WORKERS)
    assert_killed_resumes_exactly(uninterrupted, project, *DDP, kills=((2, "write"),))


@pytest.mark.slow
def test_a_hugging_face_stream_in_a_stateful_dataloader_with_workers_killed_twice_under_ddp_resumes_exactly(
    tmp_path, uninterrupted
):
    # resumed from step 1, killed again while step 3's checkpoint is written: step 2's, saved when only the second
    # worker had yielded since the resume, holds the first worker's restored position (its stream reports its start
    # until it reads), and the second resume trains on from there
    needs("torchdata", "pip install --no-deps torchdata")
    project = hf_project(tmp_path, "HFStreamData", *STATEFUL_WORKERS)
    assert_killed_resumes_exactly(uninterrupted, project, *DDP, kills=((2, "write"), (3, "write")))


@pytest.mark.slow
def test_a_hugging_face_stream_split_by_node_resumes_mid_epoch_exactly_under_fsdp2(tmp_path, uninterrupted):
    assert_resumes_exactly(uninterrupted, hf_project(tmp_path, "HFStreamData"), *FSDP2)


@pytest.mark.slow
def test_a_hugging_face_stream_uneven_among_the_ranks_ends_the_epoch_together_and_says_what_is_left(tmp_path):
    # 4 shards of 17, 16, 16 and 16 samples: split by node, one rank reads 33 (9 batches) and the other 32 (8)
    project = hf_project(tmp_path, "HFStreamData", f"--data.init_args.size={UNEVEN_HF}")
    assert_uneven_epoch_ends_together(project, UNEVEN_HF)


class Counting(IterableDataset):
    """The numbers below ``size``, whose state is how many it yielded (as Hugging Face's streams keep theirs)."""

    def __init__(self, size: int) -> None:
        self.size, self.start, self.yielded = size, 0, 0

    def __iter__(self):
        for number in range(self.start, self.size):
            self.yielded = number + 1
            yield number
        self.start = 0

    def state_dict(self) -> dict[str, int]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["yielded"]


def test_a_stream_state_per_batch_is_the_one_after_the_batches_trained_not_those_drawn_ahead():
    stream = StatePerBatch(Counting(10), batch_size=4)
    batches = iter(DataLoader(stream, batch_size=4))
    next(batches), next(batches)  # Lightning draws the second batch before it trains the first
    assert stream.state_after(1) == {"yielded": 4} and stream.stream.state_dict() == {"yielded": 8}
    resumed = StatePerBatch(Counting(10), batch_size=4)
    resumed.restore(stream.state_after(1), 1)
    assert [batch.tolist() for batch in DataLoader(resumed, batch_size=4)] == [[4, 5, 6, 7], [8, 9]]
    assert resumed.state_after(3) == {"yielded": 10}  # the last, shorter batch
