"""`--concurrency auto` in one worker: the controller of its first host (adaptive.py), a
controller per host once a second host appears (host_windows.py), where congestion signals
go, and what the controllers learned, for the next run into DEST (dest/host_memory.py).

The fetcher keeps the number of handles (its window) and reads `controller` on the
per-file path; everything else about the measuring lives here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bulkfetch.config import Limits
from bulkfetch.dest.host_memory import KEPT, Learned
from bulkfetch.engine.adaptive import Controller, open_file_ceiling
from bulkfetch.engine.host_windows import HostWindows
from bulkfetch.engine.hosts import HostGate, host_label, host_of
from bulkfetch.engine.transfers import Transfers

LEARNED_EVERY_S = 1.0  # what was learned is looked at this often (ticks come ten times as often)


class AutoConcurrency:
    def __init__(self, limits: Limits, transfers: Transfers) -> None:
        self.limits = limits
        self.transfers = transfers
        self.controller = Controller(limits.concurrency,
                                     min(limits.max_concurrency, open_file_ceiling()))
        if len(limits.remembered) == 1:  # a former run's one host: start near where it was
            self.controller.resume(*limits.remembered[0][1:])
        # Until a second host appears, `first_host` is the only one seen and the worker's
        # controller is its own.
        self.first_host: str | None = None
        self.learned: tuple[Learned, ...] = ()
        self.learned_at = -float("inf")

    def look_for_hosts(self, ready: list[tuple[str, str]]) -> None:
        """On the second host, a controller per host; the first keeps what the worker's
        controller learned of it. `ready`: a page's (name, url)."""
        if not ready:
            return
        if self.first_host is None:
            self.first_host = host_of(ready[0][1])
        first = self.first_host
        prefix = first + "/"  # one C call a URL in the usual case, not host_of()'s slicing
        if all(url.startswith(prefix) or host_of(url) == first for _, url in ready):
            return
        controller, limits = self.controller, self.limits
        windows = HostWindows(limits.concurrency, controller.ceiling, limits.remembered,
                              label=host_label)
        windows.adopt(first, controller.limit)
        controller.watch_latency = False  # each host's watches its own (adaptive.py)
        transfers = self.transfers
        if transfers.gate is None:
            transfers.gate = HostGate()
        transfers.gate.windows = transfers.windows = windows

    def _of(self, host: str) -> Controller | None:
        windows = self.transfers.windows
        return self.controller if windows is None else windows.controllers.get(host)

    def watch(self, host: str) -> tuple[int, float]:
        """(`host`'s answers so far, its recent mean latency), by its controller."""
        controller = self._of(host)
        if controller is None:
            return 0, float("inf")
        return controller.answered, controller.recent_latency

    def congested(self, url: str, told_to_wait: bool = False) -> None:
        """The server of `url` wants less: its host's controller, once there is one per
        host (then the others keep theirs), else the worker's."""
        windows = self.transfers.windows
        if windows is not None:
            windows.congested(host_of(url), told_to_wait)
        else:
            self.controller.congested(told_to_wait=told_to_wait)

    def limit_of(self, window: int) -> Callable[[str], int]:
        """A host's limit (one host alone: the worker's `window`)."""
        windows = self.transfers.windows
        return windows.limit if windows is not None else (lambda host: window)

    def learned_now(self) -> tuple[Learned, ...]:
        """What the controllers learned of their hosts, looked at every LEARNED_EVERY_S at
        most: (host, limit, lowest latency or 0.0), the highest limits first. A host is
        named without any user:password@ (the journal keeps no secret)."""
        now = time.monotonic()
        if now < self.learned_at + LEARNED_EVERY_S:
            return self.learned
        self.learned_at = now
        windows = self.transfers.windows
        if windows is not None:
            known = sorted(windows.controllers.items(), key=lambda item: -item[1].limit)
        else:
            host = self.first_host
            if host is None:  # (the plain-URL path never looks: any URL in flight says)
                urls = self.transfers.urls_in_flight()
                host = self.first_host = host_of(urls[0]) if urls else None
            known = [(host, self.controller)] if host is not None else []
        self.learned = tuple(
            (host_label(host), c.limit, c.floor_latency if c.floor_latency < float("inf") else 0.0)
            for host, c in known[:KEPT])
        return self.learned
