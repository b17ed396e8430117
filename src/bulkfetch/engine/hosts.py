"""Per-host politeness in a fetcher: which transfers may start now.

A server that answers 429 or 503 with Retry-After is asking the client to stay away for
that long, not only to retry that one file later: HostGate pauses the whole host, and
transfers for it wait here (parked) while those of other hosts go on. --max-rps caps the
requests a worker starts per second on each host with a token bucket.

The fetcher consults a gate only once it has one (a --max-rps run, or the first
Retry-After): until then its per-file loop pays nothing for this.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["HostGate", "TokenBucket", "host_of"]


def host_of(url: str) -> str:
    """'scheme://host[:port]' of `url`: the unit politeness is counted in."""
    start = url.find("://")
    start = start + 3 if start >= 0 else 0
    end = url.find("/", start)
    return url if end < 0 else url[:end]


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; starts full."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("a token bucket needs a positive rate and burst")
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.level = burst
        self.stamp = clock()

    def _refill(self) -> float:
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        return now

    def take(self, amount: float = 1.0) -> float:
        """0.0 when `amount` tokens were taken now, else the seconds until they can be
        (nothing taken)."""
        self._refill()
        if self.level >= amount - 1e-9:  # a float's rounding is not a wait
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate


class HostGate:
    """Transfers (tuples whose [2] is the URL) parked per host until the host may be asked
    again: after a pause (Retry-After) or when its request rate is used up."""

    def __init__(self, max_rps: float = 0.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.max_rps = max_rps
        self.clock = clock
        self.paused_until: dict[str, float] = {}
        self.buckets: dict[str, TokenBucket] = {}
        # host -> its transfers waiting, in the order they would have started, each with
        # whether it is a big body's (it goes back to that queue)
        self.parked: dict[str, deque[tuple[tuple[Any, ...], bool]]] = {}
        self.wake: list[tuple[float, str]] = []  # (when, host) a parked host may go on
        self.count = 0  # transfers parked
        # ids of released transfers: counted already, they pass admit() once, unparked
        self.passed: set[int] = set()

    def pause(self, url: str, seconds: float) -> None:
        """No new request to `url`'s host for `seconds` from now."""
        if seconds <= 0:
            return
        host = host_of(url)
        until = self.clock() + seconds
        if until > self.paused_until.get(host, 0.0):
            self.paused_until[host] = until
            if host in self.parked:
                heapq.heappush(self.wake, (until, host))

    def admit(self, transfer: tuple[Any, ...], big: bool = False) -> bool:
        """True: `transfer` may start now (a request is counted for its host). False: it is
        parked here until its host may be asked again (release() hands it back)."""
        if self.passed and id(transfer) in self.passed:
            self.passed.discard(id(transfer))
            return True
        host = host_of(transfer[2])
        waiting = self.parked.get(host)
        if waiting is not None:  # earlier ones of this host wait: keep their order
            waiting.append((transfer, big))
            self.count += 1
            return False
        delay = self._delay(host)
        if delay <= 0.0:
            return True
        self.parked[host] = deque([(transfer, big)])
        self.count += 1
        heapq.heappush(self.wake, (self.clock() + delay, host))
        return False

    def _delay(self, host: str) -> float:
        """Seconds until `host` may be asked; 0.0 and one request counted when now."""
        until = self.paused_until.get(host)
        if until is not None:
            left = until - self.clock()
            if left > 0:
                return left
            del self.paused_until[host]
        if self.max_rps > 0:
            bucket = self.buckets.get(host)
            if bucket is None:
                # A tenth of a second's requests may go at once: smooth within 5% over
                # seconds, and a worker that just started is not held back.
                bucket = self.buckets[host] = TokenBucket(
                    self.max_rps, max(1.0, self.max_rps / 10), self.clock)
            return bucket.take()
        return 0.0

    def release(self) -> list[tuple[tuple[Any, ...], bool]]:
        """Parked transfers whose host may be asked now, in order, each counted: as many as
        the host's rate allows (all of them when only a pause held them). Each passes its
        next admit() without being counted again."""
        found: list[tuple[tuple[Any, ...], bool]] = []
        later: list[tuple[float, str]] = []  # hosts that still wait: pushed back after
        now = self.clock()
        while self.wake and self.wake[0][0] <= now:
            _, host = heapq.heappop(self.wake)
            waiting = self.parked.get(host)
            if waiting is None:
                continue
            while waiting:
                delay = self._delay(host)
                if delay > 0.0:
                    later.append((now + delay, host))
                    break
                item = waiting.popleft()
                self.passed.add(id(item[0]))
                found.append(item)
                self.count -= 1
            else:
                del self.parked[host]
        for entry in later:
            heapq.heappush(self.wake, entry)
        return found

    def next_wake(self) -> float | None:
        """Seconds until a parked host may go on; None when nothing is parked."""
        if not self.count:
            return None
        return max(0.0, self.wake[0][0] - self.clock()) if self.wake else 0.0

    def clear(self) -> None:
        """Forget every parked transfer (the fetcher is abandoning its work)."""
        self.parked.clear()
        self.wake.clear()
        self.passed.clear()
        self.count = 0
