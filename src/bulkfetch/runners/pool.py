"""Workers as the coordinator sees them: somewhere to send pages, something that answers.

A WorkerPool starts W workers, each with its own Fetcher and sink (engine/worker.py), takes
pages for whichever worker is free, and hands back what the workers said, as messages:
("pages", pages finished fetching, durable PageReports), ("tick", Tick), ("fatal", message[,
usage]), ("exit", worker) and, from a pool whose workers can die without failing the run,
("lost", worker, pages it had not made durable, how many of those it had not fetched, why,
whether its lease lapsed). The coordinator (runners/coordinator.py) knows nothing else
about them, so a pool of processes on this machine (ProcessPool) and one of actors on a
cluster (runners/ray_pool.py) are interchangeable.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import operator
import os
import queue
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from bulkfetch.config import GetOptions
from bulkfetch.engine.channel import Inboxes, StopFlag, pipe
from bulkfetch.engine.worker import worker_main
from bulkfetch.models import Page
from bulkfetch.runners.holdings import Holding, LeaseClock, Message
from bulkfetch.runners.rate_shares import Shares


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


MAX_REPLACED_PER_WORKER = 4


@dataclass
class _Process(Holding):
    worker: int
    slot: int  # its two places in the shares array (a replacement takes the lost one's)
    process: Any
    tasks: Any  # its own queue of pages
    exited: bool = False  # it said so
    gone: bool = False  # its pipe ended (or it was given up for lost): settled


class ProcessPool:
    """W forked worker processes. Each has its own queue of pages and its own results pipe
    (engine/channel.py), so one that freezes or dies holds up nobody, and the pool knows
    which pages each holds: a page goes to the worker with the fewest unfetched.

    A worker silent past --lease (stopped, a hung mount) is killed; one killed by a signal
    (that kill, the OOM killer) loses its pages to the others (the coordinator settles what
    it made durable first), and a new process with a new worker number takes its place.
    One that ends by itself before the run does (a crash) stops the run, as before: a
    replacement would crash the same way."""

    def __init__(self, options: GetOptions, target: Callable[..., None] = worker_main) -> None:
        self.context = multiprocessing.get_context("fork")
        self.options = options
        self.target = target  # what each process runs (engine/worker.py; tests: a stand-in)
        self.stop = StopFlag(self.context)
        self.inboxes = Inboxes()
        self.size = self.slots = options.limits.workers  # (size grows with replacements)
        # --limit-rate's and --max-rps's shares, two by slot: written here, read by each
        # worker at its tick (a double is read whole; a share a tick late costs nothing)
        self.shares = self.context.Array("d", [1.0 / self.size] * (2 * self.size), lock=False)
        self.procs: dict[int, _Process] = {}  # by worker number
        self.by_fd: dict[int, _Process] = {}
        self.clock = LeaseClock(options.runner.lease_s)
        self.finishing = False
        self.failed: str | None = None  # why a worker ended by itself before the run did
        self.replaced = 0

    def start(self) -> None:
        for worker in range(self.size):
            self._spawn(worker, slot=worker)

    def _spawn(self, worker: int, slot: int) -> None:
        reader, outbox = pipe()
        tasks = self.context.Queue()
        share = functools.partial(operator.getitem, self.shares, slice(2 * slot, 2 * slot + 2))
        process = self.context.Process(
            target=self.target, name=f"bulkfetch-worker-{worker}", daemon=True,
            args=(worker, self.options, tasks, outbox, self.stop, os.getpid()),
            kwargs={"share": share})
        try:
            process.start()
        except BaseException:
            os.close(reader)
            raise
        finally:
            outbox.close()  # the worker's copy is its pipe's only writer: it ends with it
        self.inboxes.add(reader)
        self.procs[worker] = self.by_fd[reader] = _Process(worker, slot, process, tasks)

    def _live(self) -> list[_Process]:
        return [proc for proc in self.procs.values() if not proc.gone]

    def send(self, page: Page) -> None:
        live = [proc for proc in self._live() if not proc.exited]
        if not live:  # dead() says so; the page stays unjournaled for the rerun
            return
        proc = min(live, key=lambda one: one.unfetched)
        proc.give(page)
        proc.tasks.put(page)

    def receive(self, timeout: float) -> list[Message]:
        messages: list[Message] = []
        taken, ended = self.inboxes.take(timeout)
        now = self.clock.look(self._live())
        for fd, said in taken.items():
            proc = self.by_fd[fd]
            if proc.gone:  # given up for lost: what it says no longer counts
                continue
            proc.exited = proc.hear(said, now) or proc.exited
            messages += said
        for fd in ended:
            messages += self._ended(self.by_fd.pop(fd))
        return messages + self._lapse(now)

    def _ended(self, proc: _Process) -> list[Message]:
        """Its pipe ended: the process is gone."""
        proc.process.join(5)
        if proc.gone:
            return []
        proc.gone = True
        code = proc.process.exitcode
        if proc.exited or code is None or code >= 0:
            if not self.finishing and self.failed is None:
                self.failed = f"worker process {proc.process.name} died (exit code {code})"
            return [] if proc.exited else [("exit", proc.worker)]
        if self.finishing:
            return [("exit", proc.worker)]
        why = self.clock.why() if proc.lapsed is not None else f"killed by signal {-code}" + (
            " (SIGKILL: the OOM killer, or kill -9)" if code == -9 else "")
        return self._lose(proc, why)

    def _lose(self, proc: _Process, why: str) -> list[Message]:
        """Its pages go to the others, and a new worker takes its place."""
        proc.gone = True
        lost = [proc.surrender(proc.worker, why), ("exit", proc.worker)]
        proc.tasks.cancel_join_thread()  # pages in its queue have no reader now
        self.replaced += 1
        if self.replaced > MAX_REPLACED_PER_WORKER * self.slots:
            # every new process dies too (a page that always exhausts memory): stop
            self.failed = f"{self.replaced} worker processes lost, the last {why}"
            return lost
        self.size += 1
        self._spawn(max(self.procs) + 1, proc.slot)
        return lost

    def _lapse(self, now: float) -> list[Message]:
        """Kill each worker silent past its lease. Not once the run is finishing: its last
        shard's flush may be long and silent, and the drain has its own deadline."""
        lost: list[Message] = []
        if self.finishing:
            return lost
        for proc in self._live():
            if self.clock.silent(proc, now):
                proc.lapsed = now
                with contextlib.suppress(OSError):
                    proc.process.kill()  # SIGKILL: a stopped process dies too; its pipe ends
            elif self.clock.unanswered(proc, now):
                # the kill has not landed within a lease (a process stuck in the kernel,
                # on a hung mount): it can write nothing before it returns, and then dies
                lost += self._lose(proc, self.clock.why())
        return lost

    def dead(self) -> str | None:
        return self.failed

    def all_gone(self) -> bool:
        return not any(proc.process.is_alive() for proc in self.procs.values())

    def finish(self, stop_now: bool) -> None:
        self.finishing = True
        if stop_now:
            self.stop.set()
        for proc in self._live():
            proc.tasks.put(None)

    def join(self) -> None:
        for proc in self.procs.values():
            proc.process.join(5)
            if proc.process.is_alive():
                proc.process.kill()
                proc.process.join(5)
        self._drop_undelivered()

    def _drop_undelivered(self) -> None:
        """The workers are gone: pages still in their queues have no reader. Their
        feeder threads would block on a full pipe and, joined at exit, hang the process
        after its summary (a Ctrl-C that stopped the workers with pages listed ahead).
        Those pages are not done in the journal; a rerun fetches them."""
        for proc in self.procs.values():
            proc.tasks.cancel_join_thread()

    def where(self, worker: int) -> str:
        return socket.gethostname()

    def share_rate(self, shares: dict[int, Shares]) -> None:
        for worker, (of_bytes, of_requests) in shares.items():
            proc = self.procs.get(worker)
            if proc is not None and not proc.gone:
                self.shares[2 * proc.slot], self.shares[2 * proc.slot + 1] = \
                    of_bytes, of_requests

    def close(self) -> None:
        self.inboxes.close()

    def kill(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(Exception):
                proc.process.kill()
        for proc in self.procs.values():
            with contextlib.suppress(Exception):
                proc.process.join(2)
        self._drop_undelivered()
