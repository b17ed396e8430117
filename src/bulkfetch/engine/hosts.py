"""Per-host politeness in a fetcher: which transfers may start now.

A server that answers 429 or 503 with Retry-After is asking the client to stay away for
that long, not only to retry that one file later: HostGate pauses the whole host, and
transfers for it wait here (parked) while those of other hosts go on. --max-rps caps the
requests a worker starts per second on each host with a token bucket, and --limit-rate
the body bytes a second it takes from each host (a transfer starts while the host's byte
bucket is not in debt; libcurl's receive-speed cap keeps one big body to the rate).

With `--concurrency auto` over more than one host, the gate also keeps each host to the
transfers in flight its own controller allows (host_windows.py): a transfer of a host at
its limit is parked until one of that host's transfers ends (done()).

The fetcher consults a gate only once it has one (a --max-rps run, the first Retry-After,
or a second host under auto): until then its per-file loop pays nothing for this.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from bulkfetch.engine.host_windows import HostWindows

__all__ = ["HostGate", "TokenBucket", "count_by_host", "host_label", "host_of"]

RESERVE_S = 0.05  # of --limit-rate, taken as a big body starts (HostGate._delay)
_FULL = math.inf  # _delay(): the host has its limit in flight; one of them ending wakes it


def host_of(url: str) -> str:
    """'scheme://host[:port]' of `url`: the unit politeness is counted in."""
    start = url.find("://")
    start = start + 3 if start >= 0 else 0
    end = url.find("/", start)
    return url if end < 0 else url[:end]


def host_label(url: str) -> str:
    """host_of(url) without any user:password@: what metrics and status may show."""
    host = host_of(url)
    scheme, sep, authority = host.rpartition("://")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}"


def count_by_host(urls: Iterable[str], limit_of: Callable[[str], int] | None = None,
                  ) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """(host label, transfers) of the URLs in flight, and (host label, limit) of those
    hosts by `limit_of(host)` (() without it); sorted. Hosts told apart only by
    credentials share a label: their counts add up, their limit is the larger."""
    counts: dict[str, int] = {}
    for url in urls:
        host = host_of(url)
        counts[host] = counts.get(host, 0) + 1
    shown: dict[str, int] = {}
    limits: dict[str, int] = {}
    for host, count in counts.items():
        label = host_label(host)
        shown[label] = shown.get(label, 0) + count
        if limit_of is not None:
            limits[label] = max(limits.get(label, 0), limit_of(host))
    return tuple(sorted(shown.items())), tuple(sorted(limits.items()))


def burst_of(rate: float) -> float:
    """A bucket's burst at `rate`: a tenth of a second's worth (smooth within 5% over
    seconds, and a worker that just started is not held back), at least one."""
    return max(1.0, rate / 10)


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

    def debit(self, amount: float) -> None:
        """Take `amount` whatever the level (bytes already received): a debt is paid off
        by waiting."""
        self._refill()
        self.level -= amount

    def retune(self, rate: float, burst: float) -> None:
        """A new rate and burst from now on; what was saved or owed stays (up to the
        new burst)."""
        self._refill()
        self.rate, self.burst = rate, burst
        self.level = min(self.level, burst)

    def give_back(self, amount: float) -> None:
        """Return `amount` taken for what did not come (no more than the burst saved)."""
        self._refill()
        self.level = min(self.burst, self.level + amount)

    def wait(self) -> float:
        """Seconds until the level is back to zero (0.0: no debt)."""
        self._refill()
        return 0.0 if self.level >= 0 else -self.level / self.rate

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

    def __init__(self, max_rps: float = 0.0, byte_rate: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_rps = max_rps
        # --limit-rate: body bytes a second per host. A transfer starts only while the
        # host's byte bucket is not in debt, and is debited the host's mean body size then;
        # the difference to its real size when it is stored.
        self.byte_rate = byte_rate
        self.byte_buckets: dict[str, TokenBucket] = {}
        self.mean_size: dict[str, float] = {}
        self.unestimated: dict[str, int] = {}  # started before any body of the host came
        # host -> [its small transfers started and not ended, what their starts took]. A
        # body stored, or ended without one, settles its share of that, not the mean of the
        # moment: the mean moves while bodies are in flight, and while it rose from the
        # first body's size at a run's start every body in flight was charged the old mean
        # and corrected by the new one (lognormal sizes went at 1.43x the rate).
        self.ledger: dict[str, list[float]] = {}
        self.clock = clock
        self.paused_until: dict[str, float] = {}
        self.buckets: dict[str, TokenBucket] = {}
        # host -> its transfers waiting, in the order they would have started, each with
        # whether it is a big body's (it goes back to that queue)
        self.parked: dict[str, deque[tuple[tuple[Any, ...], bool]]] = {}
        self.wake: list[tuple[float, str]] = []  # (when, host) a parked host may go on
        self.count = 0  # transfers parked
        # released transfers by id: counted already, each passes admit() once, unparked
        # (held here, so no other object can take the id meanwhile)
        self.passed: dict[int, tuple[Any, ...]] = {}
        self.windows: HostWindows | None = None  # per-host limits, once set (see above)
        self.full: set[str] = set()  # parked hosts waiting for one of theirs to end

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
        if self.passed and self.passed.get(id(transfer)) is transfer:
            del self.passed[id(transfer)]
            return True
        host = host_of(transfer[2])
        waiting = self.parked.get(host)
        if waiting is not None:  # earlier ones of this host wait: keep their order
            waiting.append((transfer, big))
            self.count += 1
            return False
        delay = self._delay(host, big)
        if delay <= 0.0:
            return True
        self.parked[host] = deque([(transfer, big)])
        self.count += 1
        self._wake_at(host, delay)
        return False

    def _wake_at(self, host: str, delay: float) -> None:
        """Look at parked `host` again after `delay`; a host at its limit in flight is
        looked at when it no longer is (done(), wake_hosts())."""
        if delay is _FULL:
            self.full.add(host)
        else:
            heapq.heappush(self.wake, (self.clock() + delay, host))

    def _delay(self, host: str, big: bool = False) -> float:
        """Seconds until `host` may be asked; 0.0 and one request counted when now. A big
        body's transfer takes a reserve from the byte bucket as it starts, and its bytes
        beyond that as they come (flowed())."""
        until = self.paused_until.get(host)
        if until is not None:
            left = until - self.clock()
            if left > 0:
                return left
            del self.paused_until[host]
        windows = self.windows
        if windows is not None and windows.full(host):
            return _FULL
        if self.byte_rate > 0:
            owed = self._bytes(host).wait()
            if owed > 0.0:
                return owed
            if not big and host not in self.mean_size and self.unestimated.get(host):
                return 0.01  # one body first: its size is the estimate of the next ones
        if self.max_rps > 0:
            bucket = self.buckets.get(host)
            if bucket is None:
                bucket = self.buckets[host] = TokenBucket(
                    self.max_rps, burst_of(self.max_rps), self.clock)
            wait = bucket.take()
            if wait > 0.0:
                return wait
        if self.byte_rate > 0 and big:
            # RESERVE_S of the rate for its first bytes: they take a while to show in
            # flowed(), and every big body free to start would start at once meanwhile
            self._bytes(host).debit(self.reserved)
        elif self.byte_rate > 0:
            mean = self.mean_size.get(host)
            if mean is None:
                self.unestimated[host] = self.unestimated.get(host, 0) + 1
                mean = 0.0
            else:
                self._bytes(host).debit(mean)
            entry = self.ledger.get(host)
            if entry is None:
                self.ledger[host] = [1, mean]
            else:
                entry[0] += 1
                entry[1] += mean
        if windows is not None:
            windows.started(host)
        return 0.0

    def set_byte_rate(self, rate: float) -> None:
        """This worker's new share of --limit-rate (runners/rate_shares.py), for every
        host from now on."""
        self.byte_rate = rate
        self._retune(self.byte_buckets.values(), rate)

    def set_request_rate(self, rate: float) -> None:
        """This worker's new share of --max-rps, for every host from now on."""
        self.max_rps = rate
        self._retune(self.buckets.values(), rate)

    def _retune(self, buckets: Iterable[TokenBucket], rate: float) -> None:
        """`buckets` at `rate` from now on. Hosts parked were set to wake by the old rate:
        they are looked at now (release() parks again those still held, until when the
        new rate says)."""
        for bucket in buckets:
            bucket.retune(rate, burst_of(rate))
        now = self.clock()
        for host in self.parked:
            heapq.heappush(self.wake, (now, host))

    def _bytes(self, host: str) -> TokenBucket:
        bucket = self.byte_buckets.get(host)
        if bucket is None:  # a tenth of a second's bytes may come at once
            bucket = self.byte_buckets[host] = TokenBucket(
                self.byte_rate, burst_of(self.byte_rate), self.clock)
        return bucket

    def received(self, url: str, size: int) -> None:
        """A body of `size` bytes from `url`'s host was stored (counts with --limit-rate)."""
        if self.byte_rate > 0:
            host = host_of(url)
            if self.unestimated.get(host):
                self.unestimated[host] -= 1
            self._bytes(host).debit(size - self._settle(host))
            mean = self.mean_size.get(host)
            self.mean_size[host] = size if mean is None else 0.9 * mean + 0.1 * size

    def _settle(self, host: str) -> float:
        """What the start of one of `host`'s small transfers took on average, taken off
        the ledger as one of them ends."""
        entry = self.ledger.get(host)
        if entry is None or entry[0] <= 0:
            return 0.0
        share = entry[1] / entry[0]
        entry[0] -= 1
        entry[1] = entry[1] - share if entry[0] else 0.0
        return share

    @property
    def reserved(self) -> float:
        """What a big body's start takes from the byte bucket (see _delay)."""
        return self.byte_rate * RESERVE_S

    def owed(self, url: str) -> float:
        """Seconds until `url`'s host's byte bucket is out of debt (0.0: it is not)."""
        return self._bytes(host_of(url)).wait()

    def give_back(self, url: str, size: float) -> None:
        """`size` bytes reserved for a big body did not come."""
        self._bytes(host_of(url)).give_back(size)

    def flowed(self, url: str, size: int) -> None:
        """`size` more bytes of a big body came from `url`'s host (--limit-rate): taken as
        they come, so the bucket pays for a long body while it lasts, not all at its end,
        and a big body's size is no estimate of the small ones'."""
        self._bytes(host_of(url)).debit(size)

    def ended(self, url: str, sent: bool = True) -> None:
        """A small transfer from `url`'s host ended without a body (failed, or to be
        retried): while the host's body size is unknown, the next one may start. `sent`
        False: none of its body came (stopped at its headers: a body over --spool-above,
        fetched next as a big one), so what its start took is given back. (A big body's
        transfer is charged as its bytes come: pacing.py.)"""
        host = host_of(url)
        if self.unestimated.get(host):
            self.unestimated[host] -= 1
        if self.byte_rate > 0:
            share = self._settle(host)
            if not sent and share:
                self._bytes(host).give_back(share)

    def done(self, url: str) -> None:
        """A transfer the gate let start has ended, or was let through and did not start
        (per-host limits only: the fetcher calls this once it set `windows`)."""
        host = host_of(url)
        self.windows.ended(host)  # type: ignore[union-attr]
        if host in self.full:
            self.wake_hosts((host,))

    def wake_hosts(self, hosts: Iterable[str]) -> None:
        """These hosts may have room again (one of theirs ended, or their limit rose):
        those parked at their limit are looked at now, once."""
        for host in hosts:
            if host in self.full:
                self.full.discard(host)
                heapq.heappush(self.wake, (0.0, host))

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
                delay = self._delay(host, waiting[0][1])
                if delay > 0.0:
                    if delay is _FULL:
                        self.full.add(host)
                    else:
                        later.append((now + delay, host))
                    break
                item = waiting.popleft()
                self.passed[id(item[0])] = item[0]
                found.append(item)
                self.count -= 1
            else:
                del self.parked[host]
        for entry in later:
            heapq.heappush(self.wake, entry)
        return found

    def next_wake(self) -> float | None:
        """Seconds until a parked host may go on; None when nothing is parked or only hosts
        at their limit in flight are (one of their transfers ending wakes them)."""
        if not self.count or not self.wake:
            return None
        return max(0.0, self.wake[0][0] - self.clock())

    def clear(self) -> None:
        """Forget every parked transfer (the fetcher is abandoning its work)."""
        self.parked.clear()
        self.wake.clear()
        self.passed.clear()
        self.full.clear()
        self.count = 0
        if self.windows is not None:
            self.windows.clear()
