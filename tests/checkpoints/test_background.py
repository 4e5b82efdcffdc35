"""``multigpu/checkpoints/background.py``: a save returns after a host copy; the file appears whole, one writer at a
time, in the order of the saves, removals and links; a failed write is the synchronous save's error (a run killed
mid-write is tested in tests/checkpoints/test_schedule.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter, filesystem
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from multigpu.checkpoints import background, files, sharded
from multigpu.checkpoints.background import BackgroundCheckpointIO
from multigpu.errors.failures import user_error_of
from tests.errors.test_failures import FullDisk


def test_a_save_writes_the_state_of_its_call_while_the_caller_goes_on(tmp_path, monkeypatch):
    """The caller changes the tensors right after the save returns (as the next optimizer step does); the file
    holds them as they were, a tensor held twice (a tied weight) once. The writer is held until the caller has
    changed them."""
    release, writing = threading.Event(), threading.Event()
    write = files.atomic_torch_save

    def held_write(obj, path):
        writing.set()
        assert release.wait(30)
        write(obj, path)

    monkeypatch.setattr(background, "atomic_torch_save", held_write)
    io, weights, path = BackgroundCheckpointIO(), torch.zeros(1000), tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": weights, "tied": weights}, "global_step": 1}, path)
    assert writing.wait(30) and not path.exists()  # returned while the write waits
    weights += 1  # the next step, in place
    release.set()
    io.wait()
    saved = torch.load(path, weights_only=True)
    assert saved["global_step"] == 1 and torch.equal(saved["state_dict"]["w"], torch.zeros(1000))
    assert saved["state_dict"]["tied"].data_ptr() == saved["state_dict"]["w"].data_ptr()  # saved once, as torch does
    io.teardown()


def test_one_writer_at_a_time_and_removals_after_the_write_that_replaces_them(tmp_path, monkeypatch):
    """best-2.ckpt's write is held until the test has looked for best-1.ckpt, whose removal is queued behind it."""
    active, most, order = [0], [0], []
    writing, release = threading.Event(), threading.Event()
    write = files.atomic_torch_save

    def counted_write(obj, path):
        active[0] += 1
        most[0] = max(most[0], active[0])
        if path.name == "best-2.ckpt":
            writing.set()
            assert release.wait(30)
        write(obj, path)
        order.append(("write", path.name))
        active[0] -= 1

    monkeypatch.setattr(background, "atomic_torch_save", counted_write)
    io = BackgroundCheckpointIO()
    io.save_checkpoint({"global_step": 1, "w": torch.ones(10)}, tmp_path / "best-1.ckpt")
    io.save_checkpoint({"global_step": 2, "w": torch.ones(10)}, tmp_path / "best-2.ckpt")
    io.remove_checkpoint(tmp_path / "best-1.ckpt")  # ModelCheckpoint drops the old best once the new one is saved
    assert writing.wait(30)
    assert (tmp_path / "best-1.ckpt").exists()  # not before best-2.ckpt is on disk
    io.link_checkpoint(tmp_path / "best-2.ckpt", tmp_path / "last.ckpt")
    release.set()
    io.teardown()
    assert most[0] == 1 and order == [("write", "best-1.ckpt"), ("write", "best-2.ckpt")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-2.ckpt", "last.ckpt"]
    assert os.stat(tmp_path / "best-2.ckpt").st_ino == os.stat(tmp_path / "last.ckpt").st_ino  # one file's bytes


def test_a_background_write_on_a_full_disk_is_the_disk_full_error_and_keeps_the_previous_file(tmp_path, monkeypatch):
    io, path = BackgroundCheckpointIO(), tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    io.wait()
    monkeypatch.setattr(files.os, "fdopen", lambda handle, mode: FullDisk(handle, mode.replace("b", "")))
    io.save_checkpoint({"global_step": 2, "weights": torch.zeros(10_000)}, path)  # returns: the write is queued
    with pytest.raises(OSError) as raised:
        io.save_checkpoint({"global_step": 3, "weights": torch.zeros(10_000)}, path)  # the next save reports it
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    failure = user_error_of(raised.value)
    assert str(failure).startswith(f"disk full: writing {path} failed (No space left on device)"), failure
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]  # no temporary file left
    assert torch.load(path, weights_only=True) == {"global_step": 1}
    io.teardown()


def test_a_host_copy_that_cannot_be_allocated_saves_synchronously_with_one_note(tmp_path, monkeypatch):
    def no_memory(self, checkpoint):
        raise MemoryError("cannot allocate 130 MB")

    monkeypatch.setattr(background.HostSnapshot, "take", no_memory)
    io = BackgroundCheckpointIO()
    with pytest.warns(UserWarning, match="written synchronously: its copy in host memory could not be allocated"):
        io.save_checkpoint({"global_step": 1}, tmp_path / "last.ckpt")
    assert torch.load(tmp_path / "last.ckpt", weights_only=True) == {"global_step": 1}  # written before returning
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        io.save_checkpoint({"global_step": 2}, tmp_path / "last.ckpt")
    assert later == []  # one note for the run
    assert torch.load(tmp_path / "last.ckpt", weights_only=True) == {"global_step": 2}
    io.teardown()


# -- sharded checkpoints: torch's dcp.async_save on a writer of its own -------------------------------------------


@pytest.fixture
def process_group(tmp_path):
    """A real (gloo, one process) default process group, as a sharded run has."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_sharded_save_writes_the_state_of_its_call_and_then_moves_it_into_place(tmp_path, monkeypatch, process_group):
    """``save_shards`` returns once the shards are copied, while torch's writer is held; the caller changes the
    tensors (the next optimizer step: a plain tensor and a DTensor shard, as fsdp2 saves them); the folder holds them
    as they were, and ``then`` (rank 0's move into place) runs only once the shards and their index are written. The
    next save reuses the host copy."""
    release, writing = threading.Event(), threading.Event()
    write_data = FileSystemWriter.write_data

    def held(self, plan, planner):
        writing.set()
        assert release.wait(30)
        return write_data(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", held)
    io, weights, moved = BackgroundCheckpointIO(), torch.zeros(1000), []
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
    shard = distribute_tensor(torch.zeros(8, 4), mesh, [Shard(0)])
    staging, final = tmp_path / ".last.ckpt.partial", tmp_path / "last.ckpt"

    def then():
        moved.append(sorted(p.name for p in staging.iterdir()))
        sharded.move_into_place(staging, final)

    io.save_shards({"state_dict": {"w": weights, "shard": shard}}, staging, final, then=then)
    assert writing.wait(30) and not final.exists() and moved == []  # returned while the write waits
    weights += 1  # the next step, in place
    shard.to_local().add_(1)
    release.set()
    io.wait()
    assert moved == [[".metadata", "__0_0.distcp"]]  # the move came after the shard and the index
    loaded = {
        "state_dict": {"w": torch.full((1000,), -1.0), "shard": distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])}
    }
    dcp.load(loaded, checkpoint_id=final)
    assert torch.equal(loaded["state_dict"]["w"], torch.zeros(1000))
    assert torch.equal(loaded["state_dict"]["shard"].full_tensor(), torch.zeros(8, 4))
    buffers = [b.data_ptr() for b in io._shard_stager.snapshot.buffers]
    io.save_shards(
        {"state_dict": {"w": weights, "shard": shard}},
        staging,
        final,
        then=lambda: sharded.move_into_place(staging, final),
    )
    io.wait()
    assert [b.data_ptr() for b in io._shard_stager.snapshot.buffers] == buffers  # the host copy, reused
    dcp.load(loaded, checkpoint_id=final)
    assert torch.equal(loaded["state_dict"]["w"], torch.ones(1000))
    io.teardown()


def test_a_sharded_background_write_on_a_full_disk_is_the_disk_full_error_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, process_group
):
    io, final, staging = (
        BackgroundCheckpointIO(),
        tmp_path / "checkpoints" / "last.ckpt",
        tmp_path / "checkpoints" / ".p",
    )
    io.save_shards(
        {"state_dict": {"w": torch.zeros(10)}}, staging, final, then=lambda: sharded.move_into_place(staging, final)
    )
    io.wait()

    @contextlib.contextmanager
    def full_disk(self, path, mode):
        with FullDisk(path, mode.replace("b", "") or "w") as stream:
            yield stream

    monkeypatch.setattr(filesystem.FileSystem, "create_stream", full_disk)
    moved = []
    io.save_shards({"state_dict": {"w": torch.ones(10_000)}}, staging, final, then=lambda: moved.append(1))
    with pytest.raises(OSError) as raised:
        io.wait()  # the next save or the stop reports it
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(final) and moved == []
    failure = user_error_of(raised.value)
    assert str(failure).startswith(f"disk full: writing {final} failed (No space left on device)"), failure
    monkeypatch.undo()
    loaded = {"state_dict": {"w": torch.ones(10)}}
    dcp.load(loaded, checkpoint_id=final)
    assert torch.equal(loaded["state_dict"]["w"], torch.zeros(10))  # the previous checkpoint, intact
    io.teardown()


def test_a_sharded_host_copy_that_cannot_be_allocated_writes_synchronously_with_one_note(
    tmp_path, monkeypatch, process_group
):
    def no_memory(self, checkpoint):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(background.HostSnapshot, "take", no_memory)
    io, final, staging = BackgroundCheckpointIO(), tmp_path / "last.ckpt", tmp_path / ".last.ckpt.partial"
    for step in (1, 2):
        with warnings.catch_warnings(record=True) as notes:
            warnings.simplefilter("always")
            io.save_shards(
                {"w": torch.full((10,), float(step))},
                staging,
                final,
                then=lambda: sharded.move_into_place(staging, final),
            )
        assert not staging.exists()  # written and moved into place before returning
        loaded = {"w": torch.zeros(10)}
        dcp.load(loaded, checkpoint_id=final)
        assert torch.equal(loaded["w"], torch.full((10,), float(step)))
        shown = [str(n.message) for n in notes]
        assert [m for m in shown if "could not be allocated" in m] == ([shown[0]] if step == 1 else []), (
            shown
        )  # one note for the run
    io.teardown()
