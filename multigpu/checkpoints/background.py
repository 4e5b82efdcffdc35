"""Checkpoints written in the background: a save costs the training loop a host copy of the state, not a write
(docs/checkpoints.md). Lightning's ``AsyncCheckpointIO`` clones on the GPU, queues without bound, removes early."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from lightning_utilities.core.apply_func import apply_to_collection
from torch.distributed.tensor import DTensor

from multigpu.checkpoints.files import AtomicCheckpointIO, atomic_torch_save, link_checkpoint
from multigpu.checkpoints.sharded import raise_shard_failure, shard_writer, write_shards
from multigpu.compat import dtensor_of_local

log = logging.getLogger(__name__)


def snapshot_note(error: BaseException) -> str:
    return (
        f"a checkpoint was written synchronously: its copy in host memory could not be allocated ({error})."
        " Training went on after the write; later saves try the copy again. Fix: free host memory, or pass"
        " --checkpoint.async_save=false to write every checkpoint synchronously."
    )


class HostSnapshot:
    """Copies of a checkpoint's tensors in host memory, reused from save to save while their shapes match."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []
        self.on_gpu = False
        self.ready: Any = None
        #: what each copy runs inside (a profiler's range: multigpu/observe/nvtx.py)
        self.around_copy: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext

    def take(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint with every tensor replaced by its copy."""
        previous, self.buffers, self.on_gpu = self.buffers, [], False
        copies: dict[int, torch.Tensor] = {}  # a tied weight is copied once, saved once
        held: list[torch.Tensor] = []  # alive until the end: a freed tensor's id could be reused

        def copy(tensor: torch.Tensor) -> torch.Tensor:
            if id(tensor) in copies:
                return copies[id(tensor)]
            held.append(tensor)
            if isinstance(tensor, DTensor):
                copies[id(tensor)] = dtensor_of_local(tensor, copy(tensor.to_local()))
                return copies[id(tensor)]
            original, tensor = tensor, tensor.detach()
            index = len(self.buffers)
            reuse = previous[index] if index < len(previous) else None
            if tensor.layout != torch.strided:
                reuse = tensor.to("cpu", copy=True)
            else:
                if reuse is None or reuse.shape != tensor.shape or reuse.dtype != tensor.dtype:
                    pinned = tensor.is_cuda  # a page-locked buffer: the GPU copies into it while training goes on
                    reuse = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pinned)
                reuse.copy_(tensor, non_blocking=tensor.is_cuda)
            self.on_gpu = self.on_gpu or tensor.is_cuda
            self.buffers.append(reuse)
            copies[id(original)] = reuse
            return reuse

        # one thread when several processes train: torch's parallel copy waits for cores another rank holds
        # (5 to 20 times slower on 2 busy cores; scripts/checkpoint_stall.py)
        threads = torch.get_num_threads()
        several = torch.distributed.is_available() and torch.distributed.is_initialized()
        torch.set_num_threads(1 if several and torch.distributed.get_world_size() > 1 else threads)
        try:
            with self.around_copy():
                copied = apply_to_collection(checkpoint, torch.Tensor, copy)
        finally:
            torch.set_num_threads(threads)
        self.ready = torch.cuda.Event() if self.on_gpu else None
        if self.ready is not None:
            self.ready.record()
        return copied

    def wait_copied(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()

    def free(self) -> None:
        self.buffers = []


class SnapshotStager:
    """``dcp.async_save``'s host copy by ``HostSnapshot``: torch's ``DefaultStager`` deep-copies (60% of the stall)."""

    def __init__(self, snapshot: HostSnapshot) -> None:
        self.snapshot = snapshot

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any], **kwargs: Any) -> dict[str, Any] | Future:
        copied = self.snapshot.take(state_dict)
        if not self.snapshot.on_gpu:
            return copied
        staged: Future = Future()  # torch's writer thread waits for the GPU's copy; training does not

        def when_copied() -> None:
            self.snapshot.wait_copied()
            staged.set_result(copied)

        threading.Thread(target=when_copied, name="checkpoint-copy", daemon=True).start()
        return staged

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        self.snapshot.free()


class BackgroundCheckpointIO(AtomicCheckpointIO):
    """``AtomicCheckpointIO`` whose local saves, removals and links run in order on one background thread."""

    def __init__(self) -> None:
        super().__init__()
        self._executor: ThreadPoolExecutor | None = None
        self._queued: list[Future] = []
        self._snapshot = HostSnapshot()
        self._noted = False
        self._shard_group: Any = None  # gloo: the writer's collectives stay off training's
        self._shard_stager: SnapshotStager | None = None

    def mark_copies(self, around: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext) -> None:
        """Run each host copy of a checkpoint's state inside ``around()`` (the default: nothing around it)."""
        self._snapshot.around_copy = around

    def _note_synchronous(self, error: BaseException) -> None:
        if not self._noted:
            self._noted = True
            rank_zero_warn(snapshot_note(error))

    def _submit(self, work: Callable[..., Any], *args: Any) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._queued.append(self._executor.submit(work, *args))

    def wait(self) -> None:
        """Return once every queued write, removal and link is done; raise the first that failed."""
        queued, self._queued = self._queued, []
        failure: BaseException | None = None
        for future in queued:
            error = future.exception()
            failure = failure or error
        if failure is not None:
            raise failure

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self.wait()  # never two writers
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        self.clean_once(Path(path).parent)
        try:
            copied = self._snapshot.take(checkpoint)
        except (MemoryError, RuntimeError) as error:
            self._snapshot.free()
            self._note_synchronous(error)
            atomic_torch_save(checkpoint, path)
            return

        def write() -> None:
            self._snapshot.wait_copied()
            atomic_torch_save(copied, path)

        self._submit(write)

    def save_shards(
        self,
        shards: dict[str, Any],
        folder: Path,
        checkpoint: Path,
        then: Callable[[], None] | None = None,
        timeout: timedelta | None = None,
    ) -> None:
        """Write this rank's shards into ``folder`` in the background (every rank calls it); return once copied."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        self.wait()  # the previous save is in place on every rank before this one is planned
        if self._shard_group is None:
            self._shard_group = dist.new_group(backend="gloo", timeout=timeout)
        if self._shard_stager is None:
            self._shard_stager = SnapshotStager(self._snapshot)
        group = self._shard_group
        try:
            written = dcp.async_save(
                shards, storage_writer=shard_writer(folder), process_group=group, async_stager=self._shard_stager
            )
        except (MemoryError, RuntimeError) as error:
            # on the same group as the other ranks' writers, so that this synchronous write meets their collectives
            self._shard_stager.close()
            self._note_synchronous(error)
            write_shards(shards, folder, checkpoint, process_group=group)
            if then is not None:
                then()
            return
        upload = getattr(written, "upload_completion", written)

        def finish() -> None:
            raise_shard_failure(upload.result, checkpoint)
            if then is not None:
                then()

        self._submit(finish)

    def remove_checkpoint(self, path: Any) -> None:
        self._submit(super().remove_checkpoint, path)

    def link_checkpoint(self, source: str | os.PathLike, path: str | os.PathLike) -> None:
        self._submit(link_checkpoint, source, path)

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            self._snapshot.free()
            if self._shard_stager is not None:
                self._shard_stager.close()
                self._shard_stager = None


def wait_for_checkpoints(trainer: L.Trainer) -> None:
    """Return once every checkpoint this process queued is on disk."""
    io = trainer.strategy.checkpoint_io
    if isinstance(io, BackgroundCheckpointIO):
        io.wait()
