"""An ordered pool of forked worker processes: batches go down one at a time per worker,
answers come back in submission order through a bounded window. `bulkfetch hash` runs its
file and tar-member hashers on it.

Built on os.fork and two pipes per worker rather than multiprocessing: what crosses is a
pickled batch down and a pickled list of digests up, framed by its length, and importing
multiprocessing's machinery cost about a tenth of the command's start-up (measured on
`bulkfetch hash` of one file: 66 ms, of which 5-6 ms were multiprocessing)."""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from bulkfetch.errors import BulkfetchError, UsageError

WINDOW_PER_WORKER = 4  # batches per worker that may be out ahead of the oldest unanswered
JOIN_S = 10.0  # how long a worker may take to leave before it is killed
_HEADER = 8  # bytes of a message's length, before its pickle
_WORKER_SIGNALS = {signal.SIGINT, signal.SIGTERM}

Tick = Callable[[int], None]  # a worker adds the bytes it has read
P = TypeVar("P")  # a batch's payload: what goes to a worker
C = TypeVar("C")  # a batch's context: what stays here
R = TypeVar("R")  # one result of a batch


class _Gone(Exception):
    """The other end of a pipe closed: the worker (or the main process) is gone."""


def _send(fd: int, obj: object) -> None:
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    view = memoryview(len(data).to_bytes(_HEADER, "little") + data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except (BrokenPipeError, ConnectionResetError):
        raise _Gone from None


def _read_exactly(fd: int, size: int) -> bytes:
    parts, left = [], size
    while left:
        part = os.read(fd, left)
        if not part:
            raise _Gone
        parts.append(part)
        left -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _recv(fd: int) -> Any:
    size = int.from_bytes(_read_exactly(fd, _HEADER), "little")
    return pickle.loads(_read_exactly(fd, size))


def _worker_main(down: int, up: int, make_work: Callable[[Tick], Callable[[Any], Any]],
                 counts: memoryview, slot: int) -> None:
    def tick(n: int) -> None:
        counts[slot] += n

    work = make_work(tick)
    while True:
        try:
            batch = _recv(down)
        except _Gone:  # the main process is done with us
            return
        try:
            _send(up, work(batch))
        except _Gone:
            return


def _exited_by(pid: int, deadline: float) -> bool:
    """Whether child `pid` has ended (or ends before `deadline`); it is not reaped."""
    try:
        fd = os.pidfd_open(pid)  # readable once the process has ended
    except OSError:  # (a kernel before 5.3): look every few milliseconds
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))
    finally:
        os.close(fd)


class _Worker:
    __slots__ = ("down", "name", "pid", "seq", "up")

    def __init__(self, pid: int, down: int, up: int, name: str) -> None:
        self.pid = pid
        self.down = down  # we write batches here
        self.up = up  # and read answers here
        self.name = name
        self.seq = -1  # the batch it holds, -1 when idle


class WorkerPool(Generic[P, R]):
    """Forked worker processes running `make_work(tick)(batch)` on batches, with results
    given back in submission order (map). Each worker holds one batch at a time, so a send
    never waits on a busy worker; the next batch is made ready while they work. Workers
    start as batches come for them: a run of one batch forks once."""

    def __init__(self, workers: int, make_work: Callable[[Tick], Callable[[P], list[R]]],
                 *, window: int | None = None,
                 describe: Callable[[Any], str] | None = None) -> None:
        """`describe`: a batch's context in words, for the error when its worker dies."""
        if workers < 1:
            raise UsageError("--workers must be at least 1")
        self._make_work = make_work
        self._describe = describe
        self._size = workers
        self.window = window if window is not None else WINDOW_PER_WORKER * workers
        # bytes read per worker, in memory the fork shares (MAP_SHARED, anonymous)
        self._counts = memoryview(mmap.mmap(-1, 8 * workers)).cast("q")
        self._workers: list[_Worker] = []
        self._exit_codes: dict[int, int] = {}  # pid -> exit status, once reaped

    def __enter__(self) -> WorkerPool[P, R]:
        return self

    def _start(self) -> _Worker:
        """A new worker; OSError when the system refuses one (file descriptors, processes),
        with nothing left open."""
        down_r, down_w = os.pipe2(os.O_CLOEXEC)
        try:
            up_r, up_w = os.pipe2(os.O_CLOEXEC)
        except OSError:
            os.close(down_r)
            os.close(down_w)
            raise
        try:
            pid = self._fork(down_r, up_w, closing=(down_w, up_r))
        except OSError:
            for fd in (down_r, down_w, up_r, up_w):
                os.close(fd)
            raise
        os.close(down_r)
        os.close(up_w)
        worker = _Worker(pid, down_w, up_r, f"bulkfetch-hash-{len(self._workers)}")
        self._workers.append(worker)
        return worker

    def _fork(self, down_r: int, up_w: int, closing: tuple[int, int]) -> int:
        """Fork a worker that reads batches from `down_r` and answers on `up_w`; in it,
        `closing` (the main side of its pipes) and earlier workers' pipes are closed."""
        slot = len(self._workers)
        for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
            with contextlib.suppress(AttributeError, ValueError):  # None, or closed
                stream.flush()
        # SIGINT and SIGTERM wait until the worker has its own dispositions: one that came
        # in between would run the main process's Python handler in the worker, or be lost
        # (a SIGTERM to stop it early, then waited on for JOIN_S and killed)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _WORKER_SIGNALS)
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
        if pid == 0:  # the worker: never returns into the caller's code
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # and stops us so
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                for fd in closing:  # our copies of the main side of this and earlier
                    os.close(fd)  # workers' pipes: one left open would hide EOF
                for other in self._workers:
                    os.close(other.down)
                    os.close(other.up)
                _worker_main(down_r, up_w, self._make_work, self._counts, slot)
                code = 0
            except BaseException:  # reported, then this process ends
                traceback.print_exc()
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return pid

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        for worker in self._workers:
            os.close(worker.down)  # an idle worker reads EOF and leaves
            if kind is not None or worker.seq >= 0:  # stopping early: no batch is worth
                self._signal(worker, signal.SIGTERM)  # finishing
        deadline = time.monotonic() + JOIN_S
        for worker in self._workers:
            if not self._join(worker, deadline):
                self._signal(worker, signal.SIGKILL)
                self._join(worker, None)
            os.close(worker.up)
        self._workers.clear()

    def _signal(self, worker: _Worker, number: int) -> None:
        if worker.pid not in self._exit_codes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, number)

    def _join(self, worker: _Worker, deadline: float | None) -> bool:
        """Reap `worker`, waiting until `deadline` (None: as long as it takes); False when
        it is still running then."""
        if worker.pid in self._exit_codes:
            return True
        if deadline is not None and not _exited_by(worker.pid, deadline):
            return False
        try:
            _, status = os.waitpid(worker.pid, 0)
            self._exit_codes[worker.pid] = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere
            self._exit_codes[worker.pid] = -1
        return True

    def bytes_done(self) -> int:
        return sum(self._counts)

    def map(self, batches: Iterable[tuple[P, C]]) -> Iterator[tuple[C, list[R]]]:
        """(context, digests) of each (payload, context) in `batches`, in their order; only
        the payload goes to a worker. `batches` is read lazily, at most `window` batches
        ahead of the oldest one not yet given back."""
        source = iter(batches)
        held: dict[int, C] = {}  # seq -> context, sent and not yet given back
        arrived: dict[int, list[R]] = {}  # seq -> digests that came before their turn
        idle = list(reversed(self._workers))
        sent = given = 0
        upcoming = next(source, None)
        while True:
            while upcoming is not None and sent < given + self.window:
                if not idle:
                    if len(self._workers) == self._size:
                        break
                    try:
                        idle.append(self._start())
                    except OSError as exc:
                        if not self._workers:
                            raise BulkfetchError(
                                f"cannot start a worker process: {exc.strerror}. Raise the "
                                "limit (ulimit -n, ulimit -u) or give fewer --workers"
                            ) from None
                        self._size = len(self._workers)  # what the system allows: go on
                        break
                payload, context = upcoming
                worker = idle.pop()
                worker.seq, held[sent] = sent, context
                try:
                    _send(worker.down, payload)
                except _Gone:
                    raise self._died(worker, context) from None
                sent += 1
                upcoming = next(source, None)
            if given == sent:
                return
            idle += self._collect(arrived, held)
            while given in arrived:
                yield held.pop(given), arrived.pop(given)
                given += 1

    def _collect(self, arrived: dict[int, list[R]], held: dict[int, Any]) -> list[_Worker]:
        """Wait for at least one busy worker's answer; the workers that answered. A worker
        that died has its pipe closed: reading it fails, and the run stops."""
        busy = {worker.up: worker for worker in self._workers if worker.seq >= 0}
        poller = select.poll()
        for fd in busy:
            poller.register(fd, select.POLLIN)
        answering = [busy[fd] for fd, _ in poller.poll()]
        for worker in answering:
            try:
                arrived[worker.seq] = _recv(worker.up)
            except _Gone:
                raise self._died(worker, held.get(worker.seq)) from None
            worker.seq = -1
        return answering

    def _died(self, worker: _Worker, context: Any) -> BulkfetchError:
        self._join(worker, time.monotonic() + 1)
        code = self._exit_codes.get(worker.pid, "unknown")
        doing = (f" while it read {self._describe(context)}"
                 if self._describe is not None and context is not None else "")
        return BulkfetchError(
            f"{worker.name} stopped unexpectedly (exit status {code}){doing}; a file "
            "truncated while BLAKE3 had it mapped ends a worker so")
