"""`bulkfetch serve --max-concurrent N --max-rps N`: limits a polite client must respect,
exact across every server process.

Both live in memory shared by the processes forked after they are made (runner.py makes
them before the fork, like faults.SharedAttempts):

- ConcurrencyLimit: a POSIX semaphore of N permits. A request takes one when its head is
  parsed and gives it back when its answer is fully written, or its connection is gone
  (http.LimitedHttpConnection); a request that finds none left is refused (503, "overload").
- RateLimit: the times of the last N accepted requests, in a ring under a lock (a sliding
  one-second log): a request is accepted when the N-th latest acceptance is at least one
  second old, so no window of one second ever holds more than N acceptances, and a refused
  request always had N of them in the second before it (429, or S3's 503; "throttle").

With neither switch, none of this exists and the connections are the plain class."""

from __future__ import annotations

import mmap
import multiprocessing
import struct
import time
from collections.abc import Callable

from bulkfetch.server.faults import Fault

MAX_RPS = 10_000_000  # the ring holds 8 bytes an accepted request of the last second
_SLOT = struct.Struct("d")
_INDEX = struct.Struct("q")
_FORK = multiprocessing.get_context("fork")


class ConcurrencyLimit:
    """At most `limit` permits out at once, across processes."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        # Bounded: giving back a permit never taken is a bug, and raises
        self._permits = _FORK.BoundedSemaphore(limit)

    def try_acquire(self) -> bool:
        return self._permits.acquire(False)

    def release(self) -> None:
        self._permits.release()

    @property
    def in_flight(self) -> int:
        return self.limit - self._permits.get_value()


class RateLimit:
    """At most `limit` acceptances in any window of `window` seconds, across processes.
    `clock`: monotonic seconds, the same in every process (time.monotonic is system-wide)."""

    def __init__(self, limit: int, window: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= limit <= MAX_RPS:
            raise ValueError(f"limit must be 1..{MAX_RPS}, got {limit}")
        self.limit = limit
        self.window = window
        self._clock = clock
        # Stamps are kept as clock() - origin + window + 1 (so >= window + 1): a slot still
        # zero, never used, is always old enough. Slot 0 holds the index of the oldest.
        self._origin = clock() - window - 1.0
        self._ring = mmap.mmap(-1, _INDEX.size + _SLOT.size * limit)  # zeros, shared
        self._lock = _FORK.Lock()

    def try_accept(self) -> bool:
        ring, limit = self._ring, self.limit
        with self._lock:
            now = self._clock() - self._origin
            (oldest,) = _INDEX.unpack_from(ring, 0)
            at = _INDEX.size + _SLOT.size * oldest
            (stamp,) = _SLOT.unpack_from(ring, at)
            if stamp > now - self.window:  # the limit-th latest acceptance is too recent
                return False
            _SLOT.pack_into(ring, at, now)
            _INDEX.pack_into(ring, 0, oldest + 1 if oldest + 1 < limit else 0)
            return True


class Limits:
    """What LimitedHttpConnection asks before answering a request."""

    def __init__(self, concurrency: ConcurrencyLimit | None = None,
                 rate: RateLimit | None = None) -> None:
        self.concurrency = concurrency
        self.rate = rate
        self.holds = concurrency is not None  # an accepted request holds a permit

    @classmethod
    def create(cls, max_concurrent: int | None, max_rps: int | None) -> Limits | None:
        """The shared limits of these switches (before forking), or None when both are off."""
        if max_concurrent is None and max_rps is None:
            return None
        return cls(ConcurrencyLimit(max_concurrent) if max_concurrent is not None else None,
                   RateLimit(max_rps) if max_rps is not None else None)

    def admit(self) -> Fault:
        """Fault.NONE: accepted, and holding a permit when concurrency is limited (give it
        back with release()); Fault.OVERLOAD: too many in flight; Fault.RATE: over the
        rate (holding nothing)."""
        concurrency = self.concurrency
        if concurrency is not None and not concurrency.try_acquire():
            return Fault.OVERLOAD
        if self.rate is not None and not self.rate.try_accept():
            if concurrency is not None:
                concurrency.release()
            return Fault.RATE
        return Fault.NONE

    def release(self) -> None:
        """The end of an accepted request (when concurrency is limited)."""
        if self.concurrency is not None:
            self.concurrency.release()
