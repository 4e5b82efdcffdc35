"""One live run per run directory: ``<run dir>/.run.lock`` names the process that holds it (docs/checkpoints.md,
"One live run per directory"). Hard-linked from a draft: two runs cannot both take it, nor a reader see half of it."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from multigpu.errors import ConfigurationError, notice
from multigpu.facts.environment import Launch
from multigpu.faults.processes import HEARTBEAT_S, process_gone, process_start

LOCK_FILE = ".run.lock"
#: how old the heartbeat of a holder on another host may grow before the holder counts as gone (a node failure)
STALE_AFTER_S = 300.0
#: how long a rank other than 0 of an srun or torchrun launch waits for rank 0 to take over a lock it cannot judge
RANK_WAIT_S = 60.0
#: the lock's token, inherited by the ranks Lightning's launcher starts
TOKEN_ENV = "TEMPLATE_RUN_LOCK_TOKEN"
#: a takeover's guard file older than this was left by a process killed while taking over
GUARD_STALE_S = 30.0
TAKE_ATTEMPTS = 20
#: a change another host makes is seen only by looking again: flock is node-local on some Lustre and NFS mounts
LOOK_AGAIN_S = 0.5


class HeldRunDir:
    """A run directory this process holds: its lock file, refreshed by a heartbeat until ``release``."""

    def __init__(self, path: Path, token: str, created: list[Path]) -> None:
        self.path, self.token, self.created = path, token, created
        self.pid = os.getpid()
        self.inode = os.stat(path).st_ino
        self._stop = threading.Event()
        threading.Thread(target=self._heartbeat, name="run-dir-heartbeat", daemon=True).start()
        os.environ[TOKEN_ENV] = token

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if os.stat(self.path).st_ino != self.inode:
                    return  # taken over (this process was taken for gone): the lock is another run's now
                os.utime(self.path)
            except FileNotFoundError:
                return
            except OSError:
                continue  # a network file system's passing failure

    def release(self) -> None:
        """Delete the lock (if still this one) and the empty folders taking it created; stop the heartbeat."""
        if os.getpid() != self.pid:
            return  # a forked child (a DataLoader worker) holds nothing
        self._stop.set()
        if os.environ.get(TOKEN_ENV) == self.token:
            del os.environ[TOKEN_ENV]
        found = read_lock(self.path)
        if found is not None and found[0].get("token") == self.token:
            self.path.unlink(missing_ok=True)
        _remove_empty(self.created)


_held: dict[Path, HeldRunDir] = {}


def release_run_dir() -> None:
    """Let go of every run directory this process holds."""
    while _held:
        _held.popitem()[1].release()


atexit.register(release_run_dir)


def hold_run_dir(run_dir: str | os.PathLike | None, command: str, launch: Launch | None = None) -> HeldRunDir | None:
    """Hold ``run_dir`` or refuse naming the live run that holds it; None where another process of this launch does.
    ``launch``: the run's (``facts.launch``); by default a plain command's rank 0."""
    launch = launch or Launch()
    path = Path(run_dir or os.getcwd()).absolute() / LOCK_FILE
    if path in _held:
        return _held[path]
    token = os.environ.get(TOKEN_ENV)
    found = read_lock(path)
    if token and found is not None and found[0].get("token") == token:
        return None  # a rank that Lightning's launcher started: the launcher holds the directory for it
    if launch.rank != 0:
        if launch.job is not None:
            _wait_for_rank_zero(path, command, launch)
        return None
    return _take(path, command, launch)


def read_lock(path: Path) -> tuple[dict[str, Any], str] | None:
    """The lock's record and text; ``({}, text)`` where it is not a record; None where there is no lock."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}, ""
    try:
        record = json.loads(text)
    except ValueError:
        return {}, text
    return (record if isinstance(record, dict) else {}), text


def _take(path: Path, command: str, launch: Launch) -> HeldRunDir:
    created = _make_folder(path.parent)
    token = uuid.uuid4().hex
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": process_start(os.getpid()),
        "machine": _machine(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command,
        "job": launch.job,
        "step": launch.step,
        "start": launch.start,
        "trial": launch.trial,
        "token": token,
    }
    try:
        for _ in range(TAKE_ATTEMPTS):
            if _create(path, record):
                return _hold(path, token, created)
            found = read_lock(path)
            if found is None:
                continue
            holder, text = found
            why = gone_because(holder, path, launch)
            if why is None:
                raise ConfigurationError(refusal(path, holder, command))
            with _takeover_guard(path):
                current = read_lock(path)
                if current is not None and current[1] == text:  # still the lock judged gone, not a new run's
                    _replace(path, record)
                    notice(f"taking over {path.parent}: its {LOCK_FILE} named {describe(holder)}, gone ({why}).")
                    return _hold(path, token, created)
        raise ConfigurationError(
            f"--trainer.default_root_dir={path.parent}: {path} changed hands {TAKE_ATTEMPTS} times while this run"
            " tried to take it, so several runs are starting into it at once. Fix: start one run per directory."
        )
    except BaseException:
        _remove_empty(created)
        raise


def _hold(path: Path, token: str, created: list[Path]) -> HeldRunDir:
    _held[path] = HeldRunDir(path, token, created)
    return _held[path]


def _create(path: Path, record: Mapping[str, Any]) -> bool:
    temporary = _draft(path, record)
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: exclusive creation, which a reader may see half-written
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w") as handle:
            handle.write(temporary.read_text())
        return True
    finally:
        temporary.unlink(missing_ok=True)


def _replace(path: Path, record: Mapping[str, Any]) -> None:
    """Replace the lock in one step: a run that looks meanwhile never finds none, which it would take unguarded."""
    os.replace(_draft(path, record), path)


def _draft(path: Path, record: Mapping[str, Any]) -> Path:
    temporary = path.with_name(f"{path.name}.{record['token']}")
    temporary.write_text(json.dumps(record, indent=1) + "\n")
    return temporary


@contextlib.contextmanager
def _takeover_guard(path: Path) -> Iterator[None]:
    """This process alone may replace the lock within: two runs that found it gone must not both take it."""
    guard = path.with_name(path.name + ".takeover")
    while True:
        try:
            os.close(os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            break
        except FileExistsError:
            age = _age(guard)
            if age is not None and age > GUARD_STALE_S:
                guard.unlink(missing_ok=True)
            elif age is not None:
                time.sleep(LOOK_AGAIN_S)
    try:
        yield
    finally:
        guard.unlink(missing_ok=True)


def _wait_for_rank_zero(path: Path, command: str, launch: Launch) -> None:
    """Go on where the lock is this launch's, gone or absent; refuse where a live run holds it after ``RANK_WAIT_S``."""
    deadline = time.monotonic() + RANK_WAIT_S
    while True:
        found = read_lock(path)
        if found is None:
            return
        holder = found[0]
        launched = launch.job, launch.step, launch.start
        ours = (holder.get("job"), holder.get("step"), holder.get("start", 0)) == launched
        if ours or gone_because(holder, path, launch) is not None:
            return
        if time.monotonic() >= deadline:
            raise ConfigurationError(refusal(path, holder, command))
        time.sleep(LOOK_AGAIN_S)


def gone_because(holder: Mapping[str, Any], path: Path, launch: Launch) -> str | None:
    """Why the holder of the lock at ``path`` is gone, seen from a process of ``launch``; None while it lives."""
    job, start = holder.get("job"), holder.get("start", 0)
    if launch.job is not None and job == launch.job and start != launch.start:
        return f"an earlier start of {job}, restart {start}; this is restart {launch.start}"
    if launch.rank == 0 and launch.trial is not None and holder.get("trial") == launch.trial:
        return f"an earlier start of sweep {launch.trial}, which this sweep worker has claimed"
    if on_this_machine(holder):
        return _process_gone(holder)
    age = _age(path)
    if age is not None and age > STALE_AFTER_S:
        return f"no heartbeat for {age:.0f} s, more than {STALE_AFTER_S:.0f} s"
    return None


def _process_gone(holder: Mapping[str, Any]) -> str | None:
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return "the lock names no process"
    if pid == os.getpid():
        return "a lock this process left from an earlier command"
    return process_gone(pid, holder.get("process_start"), seen="the lock was taken")


def on_this_machine(holder: Mapping[str, Any]) -> bool:
    """Whether the holder's process id names a process here: the same host, boot and process-id namespace."""
    return holder.get("host") == socket.gethostname() and holder.get("machine") == _machine()


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    # a container has its own process-id namespace
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot} {namespace}"


def _age(path: Path) -> float | None:
    try:
        return max(0.0, time.time() - os.stat(path).st_mtime)
    except OSError:
        return None


def describe(holder: Mapping[str, Any], age_s: float | None = None) -> str:
    """``process 4242 on host node01 (SLURM job 81, step 0, restart 1), running `fit` since ...``."""
    if not isinstance(holder.get("pid"), int):
        return "a run whose lock cannot be read"
    start, trial = holder.get("start"), holder.get("trial")
    about = [holder.get("job"), holder.get("step"), f"restart {start}" if start else None]
    about.append(f"sweep {trial}" if trial else None)
    shown = ", ".join(str(part) for part in about if part)
    text = f"process {holder['pid']} on host {holder.get('host', '?')}{f' ({shown})' if shown else ''}"
    text += f", running `{holder.get('command', '?')}` since {holder.get('since', '?')}"
    return text + (f", last heartbeat {age_s:.0f} s ago" if age_s is not None else "")


def refusal(path: Path, holder: Mapping[str, Any], command: str) -> str:
    """The paragraph refusing a run into the directory ``holder`` holds."""
    run_dir = path.parent
    wait = "wait for that run to finish (it lets go of the directory when it exits"
    if not on_this_machine(holder) and isinstance(holder.get("pid"), int):
        wait += f"; one on another host that was killed is taken over after {STALE_AFTER_S:.0f} s without heartbeat"
    other = "start this one in another directory with --trainer.default_root_dir=<new dir>"
    if command != "fit":
        other += f" (it can still evaluate that run's checkpoints, e.g. --ckpt_path={run_dir}/checkpoints/last.ckpt)"
    return (
        f"--trainer.default_root_dir={run_dir} is in use by another run: {describe(holder, _age(path))}; it holds"
        f" {path}. Two runs in one directory would write over each other's checkpoints and logs. Fix: {wait}), or"
        f" {other}; nothing was changed."
    )


def _make_folder(folder: Path) -> list[Path]:
    """Make ``folder``; returns the folders made, deepest first."""
    made, probe = [], folder
    while not probe.exists() and probe != probe.parent:
        made.append(probe)
        probe = probe.parent
    folder.mkdir(parents=True, exist_ok=True)
    return made


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break
