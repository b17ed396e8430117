"""--limit-rate and --max-rps over several workers: where the bytes (or requests) are
wanted, the rate goes.

Each worker paces its hosts to its share of the run's rate (hosts.HostGate, pacing.py), so
the workers together never go above it. An equal share each wastes most of it when the
work is not spread evenly: one big file is fetched by one worker, which then had half the
rate on two cores and an eighth on eight (one 64 MiB file at --limit-rate 20m went at
10.2 MiB/s with -w 2; one page of 400 files at --max-rps 100, at 50 requests a second).

So every BALANCE_S the coordinator looks at each worker: what it moved (its ticks' bytes,
those of the big bodies in flight included; or its requests done), and whether its
transfers waited on its shares since the last look (Tick.held_ticks: a worker paying off a
burst moves nothing for a while, yet wants all it has). A worker that neither waited nor
moved SATURATED of its share keeps what it moved, with HEADROOM to grow, never less than
FLOOR of an equal share (a worker that gets work starts at once, and is seen waiting at the
next look) and never more than it had; the others split the rest. When all of them want
more, the shares are equal again; when none does, they stay. The shares always add up to
the whole: a worker given less slows at its next tick, so the sum can pass the rate only
for a tick's time after a change. With several hosts, a worker's bytes are counted over
all of them: the shares then follow the workers' traffic as a whole, and are never less
fair than equal ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence

from bulkfetch.config import Limits
from bulkfetch.models import Tick

BALANCE_S = 0.5
SATURATED = 0.9  # a worker that moved this much of its share may want more
HEADROOM = 1.25  # what one that did not keeps: what it moved, times this
FLOOR = 0.02  # of an equal share, the least a worker keeps


def allocate(used: Sequence[float], shares: Sequence[float],
             held: Sequence[bool]) -> list[float]:
    """New shares (fractions of the rate, adding up to 1) from what each worker moved
    over the last interval and the share it had then (both fractions of the rate), and
    whether its transfers waited on that share meanwhile."""
    count = len(shares)
    equal = 1.0 / count
    wanting = [i for i in range(count) if held[i] or used[i] >= SATURATED * shares[i]]
    if len(wanting) == count:
        return [equal] * count
    if not wanting:  # nobody is held back: the shares stay (made to add up to 1)
        total = sum(shares)
        return [share / total for share in shares] if total > 0 else [equal] * count
    floor = FLOOR * equal
    # (never more than it had: one that used most of a big share keeps it; capped at an
    # equal share, one stream held by libcurl's cap just under its share lost half of it)
    new = [min(max(used[i] * HEADROOM, floor), max(shares[i], floor)) for i in range(count)]
    rest = (1.0 - sum(new[i] for i in range(count) if i not in wanting)) / len(wanting)
    for i in wanting:
        new[i] = rest
    return new


def bytes_moved(tick: Tick) -> int:
    return tick.bytes - tick.continued_bytes + tick.partial_bytes


def requests_done(tick: Tick) -> int:
    return tick.files_ok + tick.files_failed + tick.retries


class RateBalancer:
    """One limit's shares: given the workers' latest ticks now and then, their new shares
    (by worker number) when they changed (see the module docstring). `moved`: what a
    tick says the worker has done so far, in the rate's unit."""

    def __init__(self, workers: int, rate: float, moved: Callable[[Tick], int]) -> None:
        self.rate = rate
        self.count = moved
        self.equal = 1.0 / workers  # what each worker starts with
        self.started = set(range(workers))  # each has its share before its first tick
        self.shares: dict[int, float] = {}
        self.moved: dict[int, int] = {}  # worker -> its bytes at the last look
        self.waits: dict[int, int] = {}  # worker -> its held ticks at the last look
        self.looked = time.monotonic()  # the run's start: no bytes moved before it

    def look(self, ticks: Iterable[Tick], now: float,
             gone: Collection[int] = ()) -> dict[int, float] | None:
        """New shares of the workers (those started and those with a tick, but not those
        `gone`: lost), or None: not yet time, or no change worth sending."""
        elapsed = now - self.looked
        if elapsed < BALANCE_S:
            return None
        ticks = list(ticks)
        moved = {tick.worker: self.count(tick) for tick in ticks}
        waits = {tick.worker: tick.held_ticks for tick in ticks}
        before, self.moved, self.looked = self.moved, moved, now
        waited, self.waits = self.waits, waits
        workers = sorted((self.started | moved.keys()).difference(gone))
        if not workers:
            return None
        shares = [self.shares.get(worker, self.equal) for worker in workers]
        # (a worker that was not there at the last look started from nothing since)
        used = [max(moved.get(worker, 0) - before.get(worker, 0), 0) / elapsed / self.rate
                for worker in workers]
        held = [waits.get(worker, 0) > waited.get(worker, 0) for worker in workers]
        new = allocate(used, shares, held)
        if max(abs(a - b) for a, b in zip(new, shares, strict=True)) < 0.01:
            return None
        self.shares = dict(zip(workers, new, strict=True))
        return self.shares


Shares = tuple[float, float]  # a worker's fractions of --limit-rate and of --max-rps


class RateShares:
    """Both limits' balancers, as the coordinator uses them: look() gives every worker's
    (bytes, requests) shares when either changed."""

    def __init__(self, workers: int, byte_rate: float, request_rate: float) -> None:
        self.equal = 1.0 / workers
        self.bytes = RateBalancer(workers, byte_rate, bytes_moved) if byte_rate else None
        self.requests = RateBalancer(workers, request_rate, requests_done) \
            if request_rate else None

    @classmethod
    def of_run(cls, limits: Limits) -> RateShares | None:
        """The balancers a run's limits need; None with no limit or one worker."""
        if not (limits.limit_rate or limits.max_rps) or limits.workers < 2:
            return None
        return cls(limits.workers, limits.limit_rate, limits.max_rps)

    def look(self, ticks: Iterable[Tick], now: float,
             gone: Collection[int] = ()) -> dict[int, Shares] | None:
        ticks = list(ticks)
        changed = [balancer.look(ticks, now, gone)
                   for balancer in (self.bytes, self.requests) if balancer is not None]
        if not any(changed):
            return None
        workers = set().union(*(found for found in changed if found))
        return {worker: (self._share(self.bytes, worker), self._share(self.requests, worker))
                for worker in sorted(workers)}

    def _share(self, balancer: RateBalancer | None, worker: int) -> float:
        return self.equal if balancer is None else balancer.shares.get(worker, self.equal)
