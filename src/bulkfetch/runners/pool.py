"""Workers as the coordinator sees them: somewhere to send pages, something that answers.

A WorkerPool starts W workers, each with its own Fetcher and sink (engine/worker.py), takes
pages for whichever worker is free, and hands back what the workers said, as messages:
("pages", pages finished fetching, durable PageReports), ("tick", Tick), ("fatal", message[,
usage]), ("exit", worker) and, from a pool whose workers can die without failing the run,
("lost", worker, pages it had not made durable, how many of those it had not fetched, why).
The coordinator (runners/coordinator.py) knows nothing else
about them, so a pool of processes on this machine (ProcessPool) and one of actors on a
cluster are interchangeable.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import operator
import os
import queue
import socket
from typing import Any, Protocol

from bulkfetch.config import GetOptions
from bulkfetch.engine.channel import channel
from bulkfetch.engine.worker import worker_main
from bulkfetch.models import Page
from bulkfetch.runners.rate_shares import Shares

Message = tuple[Any, ...]


class WorkerPool(Protocol):
    size: int  # workers started

    def start(self) -> None: ...

    def send(self, page: Page) -> None: ...

    def receive(self, timeout: float) -> list[Message]:
        """What the workers said: waits up to `timeout` for the first message, then takes
        whatever else is there without waiting ([] when nothing came)."""
        ...

    def dead(self) -> str | None:
        """Why a worker is gone before it was told to stop (for the run's error), or None."""
        ...

    def all_gone(self) -> bool: ...

    def finish(self, stop_now: bool) -> None:
        """No more pages; `stop_now`: give up the pages in hand (interrupted, or an error)."""
        ...

    def join(self) -> None:
        """Wait for the workers to end, killing those that do not."""
        ...

    def kill(self) -> None:
        """End every worker at once (from a signal handler)."""
        ...

    def where(self, worker: int) -> str:
        """Where the worker runs (a node), for the report."""
        ...

    def share_rate(self, shares: dict[int, Shares]) -> None:
        """Each worker's fractions of --limit-rate and --max-rps from now on, by worker
        number (runners/rate_shares.py); a worker takes them up at its next tick."""
        ...

    def close(self) -> None:
        """After the run: let go of what start() took (a Ray the pool started)."""
        ...


def take_all(messages: Any, timeout: float) -> list[Message]:
    """The first message within `timeout`, then whatever else is there ([] if none came)."""
    try:
        taken = [messages.get(timeout=timeout)]
    except queue.Empty:
        return []
    while True:
        try:
            taken.append(messages.get_nowait())
        except queue.Empty:
            return taken


class ProcessPool:
    """W forked worker processes: pages down one queue, everything up one results channel."""

    def __init__(self, options: GetOptions) -> None:
        context = multiprocessing.get_context("fork")
        self.tasks, self.stop_event = context.Queue(), context.Event()
        # The pool keeps the write end too: with it closed here, the read end would say
        # EOF (EOFError) once the last worker exits, instead of "nothing yet".
        self.results, self.outbox = channel(context)
        workers = options.limits.workers
        # --limit-rate's and --max-rps's shares, two by worker: written here, read by each
        # worker at its tick (a double is read whole; a share a tick late costs nothing)
        self.shares = context.Array("d", [1.0 / workers] * (2 * workers), lock=False)
        self.workers = [
            context.Process(target=worker_main, name=f"bulkfetch-worker-{i}", daemon=True,
                            args=(i, options, self.tasks, self.outbox, self.stop_event,
                                  os.getpid()),
                            kwargs={"share": functools.partial(
                                operator.getitem, self.shares, slice(2 * i, 2 * i + 2))})
            for i in range(workers)
        ]
        self.size = len(self.workers)

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def send(self, page: Page) -> None:
        self.tasks.put(page)

    def receive(self, timeout: float) -> list[Message]:
        return take_all(self.results, timeout)

    def dead(self) -> str | None:
        for worker in self.workers:
            if not worker.is_alive():
                return f"worker process {worker.name} died (exit code {worker.exitcode})"
        return None

    def all_gone(self) -> bool:
        return not any(worker.is_alive() for worker in self.workers)

    def finish(self, stop_now: bool) -> None:
        if stop_now:
            self.stop_event.set()
        for _ in self.workers:
            self.tasks.put(None)

    def join(self) -> None:
        for worker in self.workers:
            worker.join(5)
            if worker.is_alive():
                worker.kill()
                worker.join(5)
        self._drop_undelivered()

    def _drop_undelivered(self) -> None:
        """The workers are gone: pages still in the tasks pipe have no reader. Their
        feeder thread would block on a full pipe and, joined at exit, hang the process
        after its summary (a Ctrl-C that stopped the workers with pages listed ahead).
        Those pages are not done in the journal; a rerun fetches them."""
        self.tasks.cancel_join_thread()

    def where(self, worker: int) -> str:
        return socket.gethostname()

    def share_rate(self, shares: dict[int, Shares]) -> None:
        for worker, (of_bytes, of_requests) in shares.items():
            if 0 <= worker < len(self.shares) // 2:
                self.shares[2 * worker], self.shares[2 * worker + 1] = of_bytes, of_requests

    def close(self) -> None:
        pass

    def kill(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(Exception):
                worker.kill()
        for worker in self.workers:
            with contextlib.suppress(Exception):
                worker.join(2)
        self._drop_undelivered()
