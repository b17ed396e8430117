"""`--concurrency auto` per host: each host's own controller caps its transfers in flight.

A worker's controller (adaptive.py) sizes the worker's pool of transfers by what the worker
gets. When the worker's transfers go to more than one host, a host that pushes back (a 429
or 503, a timeout, a refused connection, a latency that climbs) must give up its own share
only, not the other hosts' as well: HostWindows keeps one Controller per host, fed with that
host's answers alone, and HostGate (hosts.py) parks a transfer whose host already has its
limit in flight until one of them ends.

A run over one host never builds this: the fetcher makes it when the second host appears,
and until then the worker's controller is that host's. Over millions of hosts (a URL
table's) memory stays bounded: a host's entry goes when nothing of it is in flight and its
controller learned nothing (its limit is still the start and it met no cap).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bulkfetch.engine.adaptive import MIN_INTERVAL_S, Controller

__all__ = ["HostWindows"]

HOST_FLOOR = 1  # a host that takes one transfer at a time gets one, not the worker's floor


class HostWindows:
    def __init__(self, start: int, ceiling: int,
                 remembered: tuple[tuple[str, int, float], ...] = (),
                 clock: Callable[[], float] = time.monotonic,
                 label: Callable[[str], str] = str) -> None:
        self.start = start
        # what a former run learned of some hosts (dest/host_memory.py): (limit, floor)
        # (by a host's `label`: its name without credentials, as it was remembered)
        self.remembered = {host: (limit, floor) for host, limit, floor in remembered}
        self.label = label
        self.ceiling = ceiling
        self.clock = clock
        self.controllers: dict[str, Controller] = {}
        self.busy: dict[str, int] = {}  # host -> its transfers in flight (started, not ended)
        self.heard: set[str] = set()  # hosts with answers since the last sweep
        self.swept = clock()

    def _controller(self, host: str) -> Controller:
        controller = self.controllers.get(host)
        if controller is None:
            controller = self.controllers[host] = Controller(
                self.start, self.ceiling, floor=HOST_FLOOR, clock=self.clock, clocked=False)
            remembered = self.remembered.get(self.label(host)) if self.remembered else None
            if remembered is not None:
                controller.resume(*remembered)
        return controller

    def adopt(self, host: str, limit: int) -> None:
        """`host` was the only one so far: its controller starts from the worker's `limit`
        (what the worker's controller learned of it), not from scratch."""
        self.controllers[host] = Controller(limit, self.ceiling, floor=HOST_FLOOR,
                                            clock=self.clock, clocked=False)

    def limit(self, host: str) -> int:
        controller = self.controllers.get(host)
        return self.start if controller is None else controller.limit

    def full(self, host: str) -> bool:
        """`host` has as many transfers in flight as its controller allows."""
        return self.busy.get(host, 0) >= self.limit(host)

    def started(self, host: str) -> None:
        busy = self.busy[host] = self.busy.get(host, 0) + 1
        self._controller(host).in_flight(busy)

    def ended(self, host: str) -> None:
        """A transfer to `host` ended, whatever its outcome (it was started, or admitted
        and then not started). Transfers already in flight when this object was made end
        here too: the count stops at zero."""
        busy = self.busy.get(host, 0) - 1
        if busy > 0:
            self.busy[host] = busy
            return
        self.busy.pop(host, None)
        if host not in self.heard:  # (a host heard from is judged at the next sweep first)
            self._forget_if_plain(host)

    def completed(self, host: str, seconds: float) -> None:
        """A body came from `host` after `seconds` from start to end."""
        self._controller(host).completed(1, seconds)
        self.heard.add(host)

    def congested(self, host: str, told_to_wait: bool = False) -> None:
        self._controller(host).congested(told_to_wait=told_to_wait)
        self.heard.add(host)

    def sweep(self) -> tuple[list[str], list[tuple[str, int]]]:
        """Let each host heard from decide, at most every MIN_INTERVAL_S; returns the
        hosts whose limit rose (their parked transfers may start) and those whose limit
        fell, each with its new limit (transfers beyond it may go back to the queue)."""
        now = self.clock()
        if now - self.swept < MIN_INTERVAL_S:
            return [], []
        self.swept = now
        rose: list[str] = []
        fell: list[tuple[str, int]] = []
        for host in list(self.heard):
            controller = self.controllers.get(host)
            if controller is None:
                self.heard.discard(host)
                continue
            if controller.due(now):
                before = controller.limit
                after = controller.decide(now)
                if after > before:
                    rose.append(host)
                elif after < before and self.busy.get(host, 0) > after:
                    fell.append((host, after))
                if host not in self.busy:  # idle now: nothing more to hear until it starts
                    self.heard.discard(host)
                    self._forget_if_plain(host)
        return rose, fell

    def _forget_if_plain(self, host: str) -> None:
        """Drop an idle host's controller when it learned nothing: a new one starts the
        same (what bounds memory over millions of hosts)."""
        controller = self.controllers.get(host)
        if controller is not None and not controller.cap and controller.limit == self.start:
            del self.controllers[host]

    def clear(self) -> None:
        """Nothing is in flight any more (the fetcher abandoned its work)."""
        self.busy.clear()
