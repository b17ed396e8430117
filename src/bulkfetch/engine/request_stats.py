"""--metrics in a worker: its requests by latency bucket (with their summed seconds) and its
transfers in flight by host, which each Tick carries to the coordinator. Kept only with
--metrics: the latency costs a getinfo per file."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

from bulkfetch.engine.hosts import count_by_host
from bulkfetch.models import LATENCY_BUCKETS

HOSTS_EVERY_S = 1.0  # how often the transfers in flight are counted by host
LATENCY_SLOTS = len(LATENCY_BUCKETS) + 1  # the histogram's buckets, the last one +Inf


class RequestStats:
    def __init__(self) -> None:
        self.latency = [0] * LATENCY_SLOTS
        self.latency_sum = 0.0
        self.hosts: tuple[tuple[str, int], ...] = ()  # in flight by host
        self.host_limits: tuple[tuple[str, int], ...] = ()  # ... and their limits (auto)
        self.counted_at = 0.0

    def timed(self, seconds: float) -> None:
        """One request took `seconds` (its bucket of the latency histogram)."""
        self.latency[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    def count_hosts(self, now: float, urls: Callable[[], Iterable[str]],
                    limit_of: Callable[[str], int] | None) -> None:
        """Count the transfers in flight (`urls()`) by host and, under --concurrency auto,
        their limits (`limit_of(host)`), at most every HOSTS_EVERY_S."""
        if now - self.counted_at >= HOSTS_EVERY_S:
            self.hosts, self.host_limits = count_by_host(urls(), limit_of)
            self.counted_at = now
