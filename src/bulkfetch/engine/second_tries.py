"""The fetcher's side of stragglers.py under `--concurrency auto`: hedges sent on a handle
of their own, connects dialled again, and, when a controller lowers a limit, the transfers
above it that have not begun to receive given back to the queue rather than left to time
out (they would have counted against a server that already said it has too many).

Kept apart from fetcher.py's per-file path, which looks at two collections only (`twin`
and `dropped`, empty unless a hedge is out).
"""

from __future__ import annotations

from collections import deque

import pycurl

from bulkfetch.engine.auto import AutoConcurrency
from bulkfetch.engine.hosts import host_of
from bulkfetch.engine.stragglers import Stragglers
from bulkfetch.engine.transfers import Transfers

_URL = pycurl.URL
_HTTPHEADER = pycurl.HTTPHEADER
_TOTAL_TIME = pycurl.TOTAL_TIME


class SecondTries:
    def __init__(self, transfers: Transfers, spooling: dict[pycurl.Curl, object],
                 pending: deque, auto: AutoConcurrency | None) -> None:
        self.transfers = transfers
        self.spooling = spooling
        self.pending = pending
        self.auto = auto  # (None: a fixed --concurrency, and nothing here is ever called)
        self.book = Stragglers(transfers.options.timeouts.connect_s)
        self.requeued = 0
        self.excused = 0  # silent transfers beside the limit: the pool has as many more

    def _small_in_flight(self) -> list[pycurl.Curl]:
        idle = set(self.transfers.free)
        spooling = self.spooling
        return [handle for handle in self.transfers.handles
                if handle not in idle and handle not in spooling]

    def scan(self, now: float, window: int) -> bool:
        """Look at the transfers in flight; True when the number excused from the limit
        changed (the pool is to be resized: the limit, plus spooling, plus excused).
        `window`: the worker's limit, which also bounds the excused."""
        transfers = self.transfers
        transfer_of, buffers = transfers.transfer_of, transfers.buffers
        in_flight = ((handle, transfer_of[handle], transfer_of[handle][2],
                      bool(buffers[handle][1])) for handle in self._small_in_flight())
        auto = self.auto
        assert auto is not None
        found = self.book.scan(now, in_flight, host_of, auto.watch)
        self.book.plan_next(now, auto.controller.recent_latency)
        multi = transfers.multi
        for handle in found.redial:  # a fresh connect: libcurl drops the one under way
            multi.remove_handle(handle)
            multi.add_handle(handle)
            auto.congested(transfer_of[handle][2])
        for handle in found.drop:
            self._take_back(handle)
        for handle in found.hedge:
            self._hedge(handle)
        excused = min(found.excused, window)
        if excused == self.excused:
            return False
        self.excused = excused
        return True

    def _hedge(self, handle: pycurl.Curl) -> None:
        """The same request as `handle`'s on a handle of its own: a spare one, or a new one
        the pool keeps until the next resize (Transfers.resize) trims the idle surplus."""
        transfers = self.transfers
        free = transfers.free
        if free:
            twin = free.pop()
        else:
            twin = transfers.new_handle()
            transfers.handles.append(twin)
        transfer = transfers.transfer_of[twin] = transfers.transfer_of[handle]
        twin.setopt(_URL, transfer[2])
        if transfers.request_headers is not None:
            twin.setopt(_HTTPHEADER, transfers.request_headers(transfer))
        transfers.multi.add_handle(twin)
        self.book.pair(handle, twin)

    def settle(self, handle: pycurl.Curl, error: tuple[int, str] | None) -> bool:
        """One of a hedged pair ended: whether its end is to be handled as any transfer's.
        An answer wins and the twin is taken back; a transfer error leaves the twin alone
        to finish (or fail) for both."""
        loser = self.book.settle(handle, error is None)
        self._take_back(loser)
        return loser is not handle

    def _take_back(self, handle: pycurl.Curl) -> None:
        transfers = self.transfers
        transfers.multi.remove_handle(handle)
        for buffer in transfers.buffers[handle]:
            buffer.clear()
        transfers.free.append(handle)

    def above_limit(self, limit: int, host: str | None = None) -> None:
        """A controller lowered a limit to `limit` (`host`'s, or the worker's): transfers
        beyond it with nothing of an answer yet go back to the front of the queue: those
        still connecting first (the server has not seen them), then those that waited
        longer than their host's answers take, the longest first. (A
        younger one is left: its answer is likely on its way, and taking it back would
        close its connection for nothing.)"""
        transfers = self.transfers
        transfer_of, buffers, book = transfers.transfer_of, transfers.buffers, self.book
        mine = [handle for handle in self._small_in_flight()
                if host is None or host_of(transfer_of[handle][2]) == host]
        surplus = len(mine) - limit
        if surplus <= 0:
            return
        latency = self.auto.watch(  # type: ignore[union-attr]
            host or host_of(transfer_of[mine[0]][2]))[1]
        waiting = []
        for handle in mine:
            if buffers[handle][1] or handle in book.twin:
                continue
            waited = handle.getinfo(_TOTAL_TIME)
            if waited == 0.0 or waited > latency:  # still connecting, or overdue
                waiting.append((waited == 0.0, waited, handle))
        waiting.sort(key=lambda item: (not item[0], -item[1]))
        gate = transfers.gate
        back = []
        for _, _, handle in waiting[:surplus]:
            transfer = transfer_of[handle]
            if gate is not None:
                if transfers.windows is not None:
                    gate.done(transfer[2])
                gate.ended(transfer[2], sent=False)
            self._take_back(handle)
            back.append(transfer)
        self.pending.extendleft(reversed(back))
        self.requeued += len(back)

    def clear(self) -> None:
        self.book.clear()
