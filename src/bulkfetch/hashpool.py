"""An ordered pool of forked worker processes: batches go down one at a time per worker,
answers come back in submission order through a bounded window. `bulkfetch hash` runs its
file and tar-member hashers on it."""

from __future__ import annotations

import mmap
import multiprocessing
import signal
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar

from bulkfetch.errors import BulkfetchError, UsageError

WINDOW_PER_WORKER = 4  # batches per worker that may be out ahead of the oldest unanswered

Tick = Callable[[int], None]  # a worker adds the bytes it has read
P = TypeVar("P")  # a batch's payload: what goes to a worker
C = TypeVar("C")  # a batch's context: what stays here
R = TypeVar("R")  # one result of a batch


def _worker_main(conn: Connection, make_work: Callable[[Tick], Callable[[Any], Any]],
                 counts: Any, slot: int, inherited: list[Connection]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides about Ctrl-C
    for other in inherited:  # the main side of this and earlier workers' pipes, copied by
        other.close()  # fork: a copy left open would keep its worker from ever reading EOF

    def tick(n: int) -> None:
        counts[slot] += n

    work = make_work(tick)
    while True:
        try:
            batch = conn.recv()
        except EOFError:  # the main process is done with us
            return
        try:
            conn.send(work(batch))
        except (BrokenPipeError, ConnectionResetError):
            return


class _Worker:
    __slots__ = ("conn", "process", "seq")

    def __init__(self, conn: Connection, process: multiprocessing.process.BaseProcess) -> None:
        self.conn = conn
        self.process = process
        self.seq = -1  # the batch it holds, -1 when idle


class WorkerPool(Generic[P, R]):
    """Forked worker processes running `make_work(tick)(batch)` on batches, with results
    given back in submission order (map). Each worker holds one batch at a time, so a send
    never waits on a busy worker; the next batch is made ready while they work."""

    def __init__(self, workers: int, make_work: Callable[[Tick], Callable[[P], list[R]]],
                 *, window: int | None = None) -> None:
        if workers < 1:
            raise UsageError("--workers must be at least 1")
        self._make_work = make_work
        self._size = workers
        self.window = window if window is not None else WINDOW_PER_WORKER * workers
        self._context = multiprocessing.get_context("fork")
        # bytes read per worker, in memory shared across the fork (no ctypes to import)
        self._counts = memoryview(mmap.mmap(-1, 8 * workers)).cast("q")
        self._workers: list[_Worker] = []

    def __enter__(self) -> WorkerPool[P, R]:
        return self  # workers start as batches come for them: one batch, one fork

    def _start(self) -> _Worker:
        ours, theirs = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_worker_main,
            args=(theirs, self._make_work, self._counts, len(self._workers),
                  [ours, *(worker.conn for worker in self._workers)]),
            name=f"bulkfetch-hash-{len(self._workers)}", daemon=True)
        process.start()
        theirs.close()
        worker = _Worker(ours, process)
        self._workers.append(worker)
        return worker

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        for worker in self._workers:
            worker.conn.close()  # an idle worker reads EOF and leaves
            if kind is not None or worker.seq >= 0:
                worker.process.terminate()  # stopping early: no batch is worth finishing
        for worker in self._workers:
            worker.process.join(timeout=10)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        self._workers.clear()

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
                    idle.append(self._start())
                payload, context = upcoming
                worker = idle.pop()
                worker.conn.send(payload)
                worker.seq, held[sent] = sent, context
                sent += 1
                upcoming = next(source, None)
            if given == sent:
                return
            idle += self._collect(arrived)
            while given in arrived:
                yield held.pop(given), arrived.pop(given)
                given += 1

    def _collect(self, arrived: dict[int, list[R]]) -> list[_Worker]:
        """Wait for at least one busy worker's answer; the workers that answered. A worker
        that died has its pipe closed: reading it raises, and the run stops."""
        busy = {worker.conn: worker for worker in self._workers if worker.seq >= 0}
        busy_by_sentinel = {worker.process.sentinel: worker for worker in busy.values()}
        ready = wait([*busy, *busy_by_sentinel])
        answering = {busy[obj] if isinstance(obj, Connection) else busy_by_sentinel[obj]
                     for obj in ready}
        for worker in answering:
            try:
                arrived[worker.seq] = worker.conn.recv()
            except (EOFError, OSError):
                worker.process.join(timeout=1)
                raise BulkfetchError(
                    f"{worker.process.name} stopped unexpectedly (exit status "
                    f"{worker.process.exitcode}); a file truncated while BLAKE3 had it "
                    "mapped ends a worker so") from None
            worker.seq = -1
        return list(answering)
