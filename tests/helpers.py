"""Callbacks and workloads used only by the tests (importable by the CLI in test subprocesses), and files that run
code when unpickled (a checkpoint from someone else)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from multigpu.checkpoints.background import wait_for_checkpoints
from multigpu.faults.preemption import PreemptionCheckpoint

# the engine ships the callback a project's tests stop runs with; the tests' commands name it here too
from multigpu.testing import SignalAtStep as SignalAtStep


def wait_for(
    condition: Callable[[], object],
    what: str,
    timeout: float = 120,
    process: subprocess.Popen | None = None,
    poll: float = 0.01,
) -> None:
    """Return once ``condition()`` is true. Fail naming ``what`` when it is not after ``timeout`` seconds (a bound
    on a failure, never a pause), or, with ``process``, as soon as that process has exited without it (with the end
    of its output); ``process`` is killed on a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        exited = process is not None and process.poll() is not None  # before the check: it may exit just after it
        if condition():
            return
        if exited:
            assert process is not None
            outputs = [o.decode(errors="replace") if isinstance(o, bytes) else o for o in process.communicate()]
            tail = "\n".join(text[-3000:] for text in outputs if text)
            raise AssertionError(f"waiting for {what}: the process exited ({process.returncode}) without it\n{tail}")
        if time.monotonic() > deadline:
            if process is not None:
                process.kill()
            raise AssertionError(f"waiting for {what}: not within {timeout} s")
        time.sleep(poll)


def lines(path: Path) -> list[str]:
    """The complete lines of a file another process appends to (none while it does not exist)."""
    return path.read_text().split("\n")[:-1] if path.exists() else []


class RecordParameters(Callback):
    """Appends ``step <sum of parameters>`` after every optimizer step to ``path`` (rank 0)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if trainer.is_global_zero:
            total = sum(p.detach().double().sum().item() for p in pl_module.parameters())
            with open(self.path, "a") as handle:
                handle.write(f"{trainer.global_step} {batch_idx} {total!r}\n")


class Pace(Callback):
    """Test-only: sleep ``seconds`` after each training batch and append the step to ``progress_file`` (rank 0): steps
    that take time, for what is measured in time (``max_time``, a time-based ``val_check_interval``, a rank's stack
    inside its step). Sleeping changes no number. A test that acts at a step holds the run there (``HoldAtStep``)."""

    def __init__(self, seconds: float = 0.1, progress_file: str = "") -> None:
        self.seconds = seconds
        self.progress_file = progress_file

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        time.sleep(self.seconds)
        if self.progress_file and trainer.is_global_zero:
            with open(self.progress_file, "a") as handle:
                handle.write(f"{trainer.global_step}\n")


class HoldAtStep(Callback):
    """Test-only, on rank 0: holds the run after optimizer step ``step``, inside the step (the engine's callbacks,
    which come after the user's, have not acted on it yet), so that a test signals or kills the run at a known step.

    Writes ``held at step <step>`` to ``held_file``, then holds until this process has received a stop signal (the
    engine's ``PreemptionCheckpoint`` handled it) or, with ``release_file``, until that file exists; each signal
    received while held adds ``received <name>`` to ``held_file``. Held for ``timeout`` seconds, the run fails,
    naming what it waited for. With ``progress_file``, every optimizer step is appended to it."""

    def __init__(
        self, step: int, held_file: str, release_file: str = "", progress_file: str = "", timeout: float = 300
    ) -> None:
        self.step = step
        self.held_file = held_file
        self.release_file = release_file
        self.progress_file = progress_file
        self.timeout = timeout
        self.last_step = -1

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero or trainer.global_step == self.last_step:
            return  # another rank, or a micro-batch that made no optimizer step
        self.last_step = trainer.global_step
        if self.progress_file:
            with open(self.progress_file, "a") as handle:
                handle.write(f"{trainer.global_step}\n")
        if trainer.global_step == self.step:
            self._hold(trainer)

    def _hold(self, trainer: L.Trainer) -> None:
        preemption = next((c for c in trainer.callbacks if isinstance(c, PreemptionCheckpoint)), None)
        if preemption is None and not self.release_file:
            raise RuntimeError("HoldAtStep waits for a stop signal that PreemptionCheckpoint handles: the run has none")
        self._note(f"held at step {self.step}")
        seen = 0

        def released() -> bool:
            nonlocal seen
            if preemption is not None and preemption.received != seen:
                seen = preemption.received
                self._note(f"received {signal.Signals(seen).name}")
            return os.path.exists(self.release_file) if self.release_file else bool(seen)

        until = f"{self.release_file} to exist" if self.release_file else "a stop signal"
        wait_for(released, f"{until}, the run held at step {self.step}", self.timeout)

    def _note(self, line: str) -> None:
        with open(self.held_file, "a") as handle:
            handle.write(line + "\n")


def hold_at(step: int, held: Path, **options: Path) -> list[str]:
    """The arguments that hold the run after optimizer step ``step`` until it has received a stop signal
    (``HoldAtStep``, with ``options`` such as ``release_file`` or ``progress_file``)."""
    settings = {"step": step, "held_file": held, **options}
    return [
        "--trainer.callbacks+=tests.helpers.HoldAtStep",
        *(f"--trainer.callbacks.{k}={v}" for k, v in settings.items()),
    ]


class SignalAtBatch(Callback):
    """Sends ``signal_name`` to this process after training batch ``batch_idx`` of epoch ``epoch`` (rank 0):
    with ``accumulate_grad_batches > 1`` that can be between the micro-batches of one optimizer step."""

    def __init__(self, batch_idx: int, epoch: int = 0, signal_name: str = "SIGTERM") -> None:
        self.batch_idx = batch_idx
        self.epoch = epoch
        self.signal_number = signal.Signals[signal_name]
        self.sent = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        due = batch_idx == self.batch_idx and trainer.current_epoch == self.epoch and trainer.is_global_zero
        if not self.sent and due:
            self.sent = True
            os.kill(os.getpid(), self.signal_number)


class SignalDuringValidation(Callback):
    """Sends ``signal_name`` to this process in the middle of the first validation after optimizer step ``step``."""

    def __init__(self, step: int, signal_name: str = "SIGTERM") -> None:
        self.step = step
        self.signal_number = signal.Signals[signal_name]
        self.sent = False

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not self.sent and not trainer.sanity_checking and trainer.global_step >= self.step:
            self.sent = True
            os.kill(os.getpid(), self.signal_number)


class Ballast(Callback):
    """Adds ``megabytes`` of random data to every checkpoint, so that writing one takes long enough for a test to
    kill the process mid-write."""

    def __init__(self, megabytes: int = 256) -> None:
        # random bytes: a file system that compresses or deduplicates cannot make the write instant
        self.ballast = torch.randint(0, 255, (megabytes * 2**20,), dtype=torch.uint8)

    def state_dict(self) -> dict[str, Any]:
        return {"ballast": self.ballast}


class RecordComputeDtypes(Callback):
    """Writes ``{"precision", "activation", "weight"}`` (rank 0) to ``path`` after the first training step: the
    dtype the model's first layer computed in, the dtype its weights are kept in, and the Trainer's precision."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: dict[str, str] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        layer = next(m for m in pl_module.modules() if isinstance(m, torch.nn.Linear))
        self.handle = layer.register_forward_hook(self._record)
        self.seen["weight"] = str(layer.weight.dtype)

    def _record(self, module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        self.seen.setdefault("activation", str(output.dtype))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if batch_idx == 0 and trainer.is_global_zero:
            self.handle.remove()
            with open(self.path, "w") as file:
                json.dump({**self.seen, "precision": str(trainer.precision)}, file)


class CrashAtStep(Callback):
    """Raises an error after optimizer step ``step``: a crash, as an out-of-memory error or a bug ends a run."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"crashed at step {self.step}")


class PauseAtStep(Callback):
    """Test-only: after optimizer step ``step`` (rank 0), let the checkpoints queued so far reach the disk, create
    ``paused_file`` and wait until ``resume_file`` exists (failing after ``timeout`` seconds), so that a test acts
    while the run is alive at a known step with the files of that step's past written (a background write of a loaded
    machine can outlast a few steps)."""

    def __init__(self, step: int, paused_file: str, resume_file: str, timeout: float = 300) -> None:
        self.step = step
        self.paused_file = paused_file
        self.resume_file = resume_file
        self.timeout = timeout

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if trainer.global_step != self.step or not trainer.is_global_zero:
            return
        wait_for_checkpoints(trainer)
        open(self.paused_file, "w").close()
        what = f"{self.resume_file} to exist, the run paused at step {self.step}"
        wait_for(lambda: os.path.exists(self.resume_file), what, self.timeout)


class RunsCommand:
    """Pickles as a call of ``os.system``: whatever unpickles it creates the file ``marker`` (that nothing may)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


#: how pickle names ``os.system`` in a file: ``posix.system``
RUNS_COMMAND_GLOBAL = f"{os.system.__module__}.system"


def folder_whose_index_runs_code(folder: Path, marker: Path) -> Path:
    """A folder that looks like a sharded checkpoint (``.metadata`` and ``meta.pt``), its index a ``RunsCommand``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".metadata").write_bytes(pickle.dumps(RunsCommand(marker)))
    torch.save({"pytorch-lightning_version": L.__version__}, folder / "meta.pt")
    return folder


def entry_runs_code(folder: Path, marker: Path, entry: str = "optimizer_0.param_groups.0.lr") -> str:
    """In a folder a run saved, replace an ``entry`` that is no tensor (an optimizer's setting) by a ``torch.save``
    file of a ``RunsCommand``, appended to its shard; the index (a plain pickle of torch's own classes) points the
    entry there. Returns the shard's name."""
    from multigpu.compat import read_checkpoint_index

    payload = io.BytesIO()
    torch.save(RunsCommand(marker), payload)
    index = read_checkpoint_index(folder / ".metadata")
    key = next(k for k in index.storage_data if k.fqn == entry)
    shard = folder / index.storage_data[key].relative_path
    offset, length = shard.stat().st_size, len(payload.getvalue())
    shard.write_bytes(shard.read_bytes() + payload.getvalue())
    index.storage_data[key] = dataclasses.replace(index.storage_data[key], offset=offset, length=length)
    (folder / ".metadata").write_bytes(pickle.dumps(index))
    return shard.name


class KillAt(Callback):
    """Test-only: SIGKILL every process of the run (its process group: all ranks, as a node failure ends them) at
    ``moment`` of optimizer step ``step``, rank 0 deciding:

    - ``step``: once the step's optimizer update is done, before its checkpoint is saved;
    - ``optimizer``: inside the step, after its backward, before the optimizer's update;
    - ``write``: on the checkpoint writer, half-way through writing the step's checkpoint (a temporary file);
    - ``rename``: on the checkpoint writer, right after the step's checkpoint was renamed into place;
    - ``anywhere``: at a random time within the step (its length taken from the step before).

    ``write`` and ``rename`` need a checkpoint at ``step`` (``--checkpoint.every_n_train_steps``).
    """

    MOMENTS = ("step", "optimizer", "write", "rename", "anywhere")

    def __init__(self, step: int, moment: str = "step") -> None:
        if moment not in self.MOMENTS:
            raise ValueError(f"moment must be one of {self.MOMENTS}, not {moment!r}")
        self.step = step
        self.moment = moment
        self.started = 0.0

    @staticmethod
    def kill() -> None:
        os.killpg(os.getpgid(0), signal.SIGKILL)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.moment in ("write", "rename") and trainer.is_global_zero:
            from multigpu.checkpoints import background, files

            original = background.atomic_torch_save

            def save(obj: Any, path: str | os.PathLike) -> None:
                if not (isinstance(obj, dict) and obj.get("global_step") == self.step):
                    original(obj, path)
                elif self.moment == "write":
                    buffer = io.BytesIO()
                    torch.save(obj, buffer)
                    temporary = Path(path).with_name(f".{Path(path).name}.killed.tmp")
                    temporary.write_bytes(buffer.getvalue()[: buffer.tell() // 2])
                    self.kill()
                else:
                    original(obj, path)
                    self.kill()

            background.atomic_torch_save = files.atomic_torch_save = save

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.moment != "anywhere" or not trainer.is_global_zero:
            return
        previous, self.started = self.started, time.monotonic()
        if trainer.global_step + 1 == self.step:  # a kill at a random moment of this step, as long as the one before
            import random
            import threading

            length = self.started - previous if previous else 0.1
            delay = random.Random().uniform(0, length)  # not the global generator, which the checkpoint saves
            threading.Timer(delay, self.kill).start()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if self.moment == "optimizer" and trainer.global_step + 1 == self.step and trainer.is_global_zero:
            self.kill()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.moment == "step" and trainer.global_step == self.step and trainer.is_global_zero:
            self.kill()
