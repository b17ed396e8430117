"""The fetcher's side of the coordinator: the Tick it sends every tenth of a second (its
counters, the big files in flight, and for --metrics the request latencies and transfers by
host), and the shares of --limit-rate and --max-rps the coordinator sends back
(runners/rate_shares.py). A mixin of Fetcher: its state lives there."""

from __future__ import annotations

import bisect
import time

import pycurl

from bulkfetch.engine.hosts import count_by_host
from bulkfetch.models import LATENCY_BUCKETS, Tick, largest_first

HOSTS_EVERY_S = 1.0  # with --metrics: how often a tick counts the transfers by host
LATENCY_SLOTS = len(LATENCY_BUCKETS) + 1  # the histogram's buckets, the last one +Inf


class CoordinatorSide:
    """Fetcher's methods for what goes to and comes from the coordinator."""

    def tick(self) -> Tick:
        """The worker's counters now, for the coordinator."""
        live = self.live
        gate = self.gate
        if gate is not None and (gate.count or (self.big.pacing is not None
                                                and self.big.pacing.held)):
            self.held_ticks += 1
        partial, largest = 0, ()
        if self.spooling or self.big.ranged:  # (a ranged file's pieces may all wait)
            partial, entries = self.big.in_flight()
            largest = tuple(sorted(entries, key=largest_first)[:self.options.shown_in_flight])
        latency: tuple[int, ...] = ()
        if self.latency is not None:
            latency = tuple(self.latency)
            now = time.monotonic()
            if now - self.hosts_counted >= HOSTS_EVERY_S:
                self._count_hosts()
                self.hosts_counted = now
        return Tick(self.worker, self.files_ok + sum(state.ok for state in live),
                    self.files_failed, self.bytes + sum(state.bytes for state in live),
                    self.retries, self.in_flight, partial, largest, self.big.restarts,
                    self.big.size_only, tuple(self.checked), self.window, self.peak_window,
                    latency, self.latency_sum, self.hosts, self.host_limits,
                    self.not_modified, self.big.continued, self.held_ticks)

    def set_rate_share(self, of_bytes: float, of_requests: float) -> None:
        """This worker's new shares (fractions) of --limit-rate, which its hosts' byte
        buckets and every handle's cap follow, and of --max-rps (runners/rate_shares.py)."""
        gate, limits = self.gate, self.options.limits
        if gate is None:
            return
        if limits.max_rps and gate.max_rps > 0:
            requests = max(0.01, limits.max_rps * of_requests)
            if abs(requests - gate.max_rps) >= 0.01 * limits.max_rps:
                gate.set_request_rate(requests)
        rate = limits.limit_rate
        if not rate or gate.byte_rate <= 0:
            return
        new = max(1.0, rate * of_bytes)
        if abs(new - gate.byte_rate) < 0.01 * rate:
            return
        gate.set_byte_rate(new)
        self.handle_rate = max(1, int(new))
        for handle in self.handles:  # (between turns of the multi: no callback runs now)
            handle.setopt(pycurl.MAX_RECV_SPEED_LARGE, self.handle_rate)
        if self.big.pacing is not None:
            self.big.pacing.hold_again()

    def _count_hosts(self) -> None:
        """Transfers in flight by host and, under --concurrency auto, their limits."""
        idle = set(self.free)
        urls = [self.transfer_of[handle][2] for handle in self.handles if handle not in idle]
        limit_of = None
        if self.controller is not None:  # one host alone: the worker's limit is its own
            limit_of = self.windows.limit if self.windows is not None else \
                (lambda host: self.window)
        self.hosts, self.host_limits = count_by_host(urls, limit_of)

    def _timed(self, seconds: float) -> None:
        """--metrics: one request took `seconds` (its bucket of the latency histogram)."""
        self.latency[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1  # type: ignore[index]
        self.latency_sum += seconds
