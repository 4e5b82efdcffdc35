"""How the command line reports an exception: one paragraph and its exit status (2 bad input, 1 the environment,
70 a failed collective); any other exception keeps its traceback. Where rank 0 launched the ranks it speaks for the
run, so which rank fails first does not change what is printed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_only
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

from multigpu.compat import release_started_processes
from multigpu.errors import debug_mode, one_paragraph
from multigpu.errors.failures import collective_failure, collective_failure_message, user_error_of

#: EX_SOFTWARE: neither a bad option (2) nor a failure of the machine (1), and not requeued
COLLECTIVE_FAILURE_EXIT_CODE = 70
REPORT_DESK_ENV = "TEMPLATE_REPORT_DESK"


def report(exception: BaseException) -> int:
    """Print a user error as one paragraph and return the exit status; re-raise anything else."""
    if debug_mode():
        raise exception
    rank = getattr(rank_zero_only, "rank", 0)
    prefix = f"(rank {rank}) " if rank else ""
    error = user_error_of(exception)
    if error is not None:
        status = getattr(error, "exit_code", 2)
        say(f"error: {prefix}{error}", status, rank_zero_reports=getattr(error, "every_rank", False))
        return status
    if collective_failure(exception):  # where every rank is, not the survivor's 150-line traceback
        waits = bool(getattr(exception, "rank_zero_reports", False))
        say(f"error: {prefix}{collective_failure_message(exception)}", COLLECTIVE_FAILURE_EXIT_CODE, waits)
        return COLLECTIVE_FAILURE_EXIT_CODE
    if isinstance(exception, ProcessExitedException):
        print(f"stopped: {one_paragraph(str(exception))}", file=sys.stderr)
        return 1
    if isinstance(exception, ProcessRaisedException):
        # the worker's own traceback, as torch hands it over; the parent's adds only torch.multiprocessing's frames
        print(str(exception).strip(), file=sys.stderr)
        return 1
    origin = getattr(exception, "multigpu_origin", None)
    if origin is not None:
        print(f"error in {origin}; its traceback follows.", file=sys.stderr, flush=True)
    raise exception


def say(text: str, status: int, rank_zero_reports: bool = False) -> None:
    """Print a report here, or hand it to rank 0's desk. ``rank_zero_reports``: rank 0 fails alike and reports."""
    address = os.environ.get(REPORT_DESK_ENV)
    message = {"text": text, "status": status, "rank_zero_reports": rank_zero_reports}
    if _desk is None and getattr(rank_zero_only, "rank", 0) and address and hand_over(address, message):
        return
    speak_for_the_run()
    print(text, file=sys.stderr, flush=True)


def hand_over(address: str, message: dict[str, Any]) -> bool:
    """True once rank 0's desk has taken the report, False where rank 0 is gone; a report that rank 0's own covers
    waits here until rank 0 stops this process."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(socket_address(address))
        connection.sendall(json.dumps(message).encode() + b"\n")
        with connection.makefile("rb") as answers:
            return bool(answers.readline())
    return False


_lock = threading.Lock()
_speaking = False  # rank 0 reports a failure of its own: a report handed over now is not printed
_desk: ReportDesk | None = None


def speak_for_the_run(trainer: Any = None) -> None:
    """From now on this process reports for the run; a report a rank hands over is not printed. With ``trainer``,
    the ranks leave Lightning's watch first, whose observer would SIGKILL this process once one of them exits."""
    global _speaking
    if trainer is not None:
        release_started_processes(trainer)
    with _lock:
        _speaking = True


def socket_address(address: str) -> str:
    """``@name``: a socket of Linux's abstract namespace (no file, gone with its process); else a file's path."""
    return "\0" + address[1:] if address.startswith("@") else address


class ReportDesk:
    """Rank 0's end of the hand-over: a thread answering the ranks' reports on a Unix socket, where a rank finds no
    listener once rank 0 is dead. ``before_exit`` runs before ``os._exit``, which runs no ``atexit``."""

    def __init__(self, trainer: Any, before_exit: Callable[[], None] = lambda: None) -> None:
        self.trainer, self.before_exit = trainer, before_exit
        self.folder = None if sys.platform.startswith("linux") else tempfile.mkdtemp(prefix="multigpu-report-")
        name = f"multigpu-report-{uuid.uuid4().hex}"
        self.address = f"@{name}" if self.folder is None else os.path.join(self.folder, "desk")
        self.waiting: list[socket.socket] = []
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.bind(socket_address(self.address))
        self.socket.listen()
        threading.Thread(target=self._serve, name="report-desk", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), name="report-desk-rank", daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        try:
            with connection.makefile("rb") as lines:
                message = json.loads(lines.readline())
        except (OSError, ValueError):
            connection.close()
            return
        with _lock:
            if _speaking:
                self._close(connection, b"rank 0 reports\n")
            elif message.get("rank_zero_reports"):
                self.waiting.append(connection)  # rank 0 will fail in its collective too, and report
            else:
                # out of Lightning's watch first, whose observer would SIGKILL this process
                started = release_started_processes(self.trainer)
                print(message["text"], file=sys.stderr, flush=True)
                self._close(connection, b"printed\n")
                for process in started:
                    process.kill()
                self.before_exit()
                self._remove_folder()
                sys.stdout.flush()
                os._exit(int(message["status"]))

    @staticmethod
    def _close(connection: socket.socket, answer: bytes) -> None:
        with contextlib.suppress(OSError):
            connection.sendall(answer)
        connection.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept
        self.socket.close()
        for connection in self.waiting:
            connection.close()
        self._remove_folder()

    def _remove_folder(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def report_desk(trainer: Any, before_exit: Callable[[], None] = lambda: None) -> Iterator[ReportDesk]:
    """Within the block, this process speaks for the ranks it starts, which inherit its desk's address."""
    global _desk, _speaking
    desk = _desk = ReportDesk(trainer, before_exit)
    _speaking = False
    os.environ[REPORT_DESK_ENV] = desk.address
    try:
        yield desk
    finally:
        os.environ.pop(REPORT_DESK_ENV, None)
        desk.close()
        _desk = None
