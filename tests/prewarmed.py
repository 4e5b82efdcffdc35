"""Start ``python -m MODULE ARGS`` in the tests without paying for torch's and Lightning's imports every time.

A short command the tests start in a subprocess spends most of its CPU time importing torch, Lightning (which
imports ``torch._dynamo``) and torchmetrics before it trains a step, and the suite starts hundreds. Here one
server process per pytest worker imports those libraries once, computes nothing, and forks a child for each
command. The child is a real process (its own pid, session, signals, file descriptors and exit status) that runs
the command as ``python -m`` does (``runpy``, ``__main__``, ``sys.argv``, ``sys.path``); what it skips are the
libraries' imports, never the template's own (the server imports nothing from ``src`` or ``tests``). The processes
that the command starts itself (the ranks of ``ddp``, torchrun's workers, SLURM's tasks) are fresh interpreters.

A command is started fresh, as before, when forking could change what it does: an environment that differs from
the server's in a variable read while the libraries are imported (``TORCH_*``, ``PYTHONWARNINGS``, ...), a
command that is not ``python -m``/``python -c``/``python SCRIPT``, or ``fresh=True`` (tests that read what a new
interpreter prints at start-up, or compare two runs' hash seeds). ``TEMPLATE_TESTS_FRESH=1`` starts every command
fresh.

Written by hand because nothing in the standard library or pytest does it: ``multiprocessing``'s forkserver runs
Python functions, not commands with their own stdio, session and exit status.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import selectors
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: what the server imports once: the libraries every command of the template imports first
PRELOAD = ("torch", "lightning.pytorch", "torchmetrics", "jsonargparse")
#: environment variables read while those libraries are imported (or at interpreter start): a command whose
#: environment differs from the server's in one of them is started fresh
READ_AT_IMPORT = (
    "TORCH", "PYTORCH", "TORCHINDUCTOR", "TORCHDYNAMO", "OMP_", "MKL_", "CUDA", "LD_", "MALLOC", "PL_", "SLURM_",
)  # fmt: skip
#: the rank Lightning's and torchmetrics' ``rank_zero_only`` take when they are imported
READ_AT_IMPORT_NAMES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "WORLD_SIZE", "JSM_NAMESPACE_RANK")
READ_AT_START = (
    "PYTHONWARNINGS", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONOPTIMIZE", "PYTHONUTF8", "PYTHONUNBUFFERED",
    "PYTHONIOENCODING", "PYTHONFAULTHANDLER", "PYTHONDEVMODE", "PYTHONTRACEMALLOC",
)  # fmt: skip
_STATUS = struct.Struct("!ii")  # (pid, 0) when the child started; (pid, return code) when it ended


# --- the server (runs as ``python tests/prewarmed.py``) -------------------------------------------------------


def serve(control: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Fork a child for each request; return only in a child, with its request and file descriptors."""
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd hears of each ending child
    status_of: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj == wakeup_read:
                os.read(wakeup_read, 4096)
                _report_ended(status_of)
                continue
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 8)
            if not message:  # the pytest worker is gone
                os._exit(0)
            request = pickle.loads(message)
            status = socket.socket(fileno=fds[-1])
            pid = os.fork()
            if pid == 0:  # the child: drop the server's state and become the command
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                selector.close()
                for fd in (control.fileno(), wakeup_read, wakeup_write, status.fileno()):
                    os.close(fd)
                for other in status_of.values():
                    other.close()
                return request, fds[:-1]
            for fd in fds[:-1]:
                os.close(fd)
            status.sendall(_STATUS.pack(pid, 0))
            status_of[pid] = status


def _report_ended(status_of: dict[int, socket.socket]) -> None:
    while status_of:
        pid, wait_status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        status = status_of.pop(pid, None)
        if status is not None:
            with contextlib.suppress(OSError):  # the test stopped waiting for it
                status.sendall(_STATUS.pack(pid, os.waitstatus_to_exitcode(wait_status)))
            status.close()


def become(request: dict[str, Any], fds: list[int], base_path: list[str]) -> None:
    """Turn this forked child into the command's process: session, stdio, directory, environment, argv, path."""
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)  # dup2 makes 0, 1 and 2 inheritable, as in any process
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    entries = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [os.getcwd(), *entries, *base_path]
    import importlib

    importlib.invalidate_caches()  # files written since the server started (a test's own module) are found
    import random

    random.seed()  # a fresh interpreter seeds from the system, not from the server's state
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def run_words(argv: list[str]) -> None:
    """Run ``argv`` (the words after ``python``) as the interpreter would; exceptions reach the interpreter."""
    import runpy

    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's path in sys.argv[0]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        import types

        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")


def _server_main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    for name in PRELOAD:
        __import__(name)
    base_path = [entry for entry in sys.path[1:] if entry not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    request, fds = serve(control)
    become(request, fds, base_path)
    run_words(request["argv"])


# --- the client (imported by the tests) -------------------------------------------------------------------------


class _Server:
    """This pytest worker's server: started at the first command, ended with the worker."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=self.env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # the server prints nothing; an import error still shows on stderr
        )
        theirs.close()
        self.control = ours
        atexit.register(self.close)

    def start(self, argv: list[str], env: dict[str, str], cwd: str, fds: list[int], new_session: bool) -> socket.socket:
        ours, theirs = socket.socketpair()
        request = {"argv": argv, "env": env, "cwd": cwd, "new_session": new_session}
        socket.send_fds(self.control, [pickle.dumps(request)], [*fds, theirs.fileno()])
        theirs.close()
        return ours

    def close(self) -> None:
        self.control.close()
        self.process.wait(timeout=10)


_server: _Server | None = None
#: the environment the server starts with (tests/conftest.py: the one most commands get), or the first command's
server_environment: Callable[[], dict[str, str]] | None = None


def _server_for(env: dict[str, str]) -> _Server | None:
    global _server
    if os.environ.get("TEMPLATE_TESTS_FRESH") == "1":
        return None
    if _server is None or _server.process.poll() is not None:
        _server = _Server(server_environment() if server_environment else env)
    if read_at_start(env) != read_at_start(_server.env):
        return None
    return _server


def read_at_start(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that the interpreter or the preloaded libraries read as they start."""
    return {
        key: value
        for key, value in env.items()
        if key.startswith(READ_AT_IMPORT) or key in READ_AT_IMPORT_NAMES or key in READ_AT_START
    }


def _python_words(args: Sequence[str]) -> list[str] | None:
    """The words after ``python`` when ``args`` runs this interpreter on a module, a string or a script."""
    if len(args) < 2 or os.path.realpath(args[0]) != os.path.realpath(sys.executable):
        return None
    if (args[1] in ("-m", "-c") and len(args) >= 3) or not args[1].startswith("-"):
        return list(args[1:])
    return None


class Prewarmed(subprocess.Popen):
    """``subprocess.Popen`` for a command forked from the server: the same arguments and methods (``poll``,
    ``wait``, ``communicate``, ``send_signal``, pipes, ``with``); its ending is reported by the server."""

    def __init__(self, args: Sequence[str], *, server: _Server, words: list[str], **kwargs: Any) -> None:
        self._server = server
        self._words = words
        self._new_session = bool(kwargs.get("start_new_session"))
        super().__init__(args, **kwargs)

    # The three methods below override Popen's private seams for starting and reaping a child (with
    # ``_close_pipe_fds``, the same in CPython 3.9 to 3.13): Popen's pipes, communicate(), timeouts and clean-up stay.
    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: bool, pass_fds: Any, cwd: Any,
                       env: Any, startupinfo: Any, creationflags: Any, shell: bool, p2cread: int, p2cwrite: int,
                       c2pread: int, c2pwrite: int, errread: int, errwrite: int, *rest: Any) -> None:  # fmt: skip
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
        environment = dict(env if env is not None else os.environ)
        self._status = self._server.start(self._words, environment, str(cwd or os.getcwd()), fds, self._new_session)
        data = self._status.recv(_STATUS.size, socket.MSG_WAITALL)
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # the child has its own
        if len(data) < _STATUS.size:
            raise RuntimeError(f"the prewarmed server did not start {args}")
        self.pid, _ = _STATUS.unpack(data)
        self._child_created = True

    def _internal_poll(self, _deadstate: Any = None, **_: Any) -> int | None:
        if self.returncode is None:
            try:
                self._read_status(timeout=0)
            except OSError:
                # Popen's clean-up of abandoned children (``_deadstate`` given) polls this one from another Popen's
                # start; a status socket gone bad must not fail that start: the child is forgotten, as Popen does
                if _deadstate is None:
                    raise
                self.returncode = _deadstate
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        if self.returncode is None and not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]

    def _read_status(self, timeout: float | None) -> bool:
        """Read the child's return code if the server reports it within ``timeout`` seconds."""
        self._status.settimeout(timeout)
        try:
            data = self._status.recv(_STATUS.size, socket.MSG_WAITALL)
        except (TimeoutError, BlockingIOError):
            return False
        if len(data) < _STATUS.size:  # the server died with the child running: never expected
            raise RuntimeError(f"the prewarmed server lost the child {self.pid} ({self.args})")
        _, self.returncode = _STATUS.unpack(data)
        self._status.close()
        return True

    def send_signal(self, sig: int) -> None:
        self.poll()
        if self.returncode is None:
            os.kill(self.pid, sig)


def popen(args: Sequence[str], *, fresh: bool = False, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)``, forked from this worker's server when that changes nothing."""
    words = _python_words(args)
    unsupported = kwargs.keys() & {"preexec_fn", "pass_fds", "shell", "executable", "user", "group", "umask"}
    if fresh or words is None or unsupported:
        return subprocess.Popen(args, **kwargs)
    env = kwargs.get("env")
    server = _server_for(dict(env if env is not None else os.environ))
    if server is None:
        return subprocess.Popen(args, **kwargs)
    return Prewarmed(args, server=server, words=words, **kwargs)


def run(args: Sequence[str], *, fresh: bool = False, timeout: float | None = None, check: bool = False,
        input: str | bytes | None = None, capture_output: bool = False, **kwargs: Any
        ) -> subprocess.CompletedProcess:  # fmt: skip
    """``subprocess.run`` through :func:`popen`."""
    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with popen(args, fresh=fresh, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result


if __name__ == "__main__":
    _server_main()
