"""--limit-rate over several workers: where the bytes are wanted, the rate goes.

Each worker paces its hosts to its share of the run's rate (hosts.HostGate, pacing.py), so
the workers together never go above it. An equal share each wastes most of it when the
bytes are not spread evenly: one big file is fetched by one worker, which then had half
the rate on two cores and an eighth on eight (one 64 MiB file at --limit-rate 20m went at
10.2 MiB/s with -w 2).

So every BALANCE_S the coordinator looks at each worker: what it moved (its ticks' bytes,
those of the big bodies in flight included), and whether its transfers waited on its share
since the last look (Tick.held_ticks: a worker paying off a burst moves nothing for a
while, yet wants all it has). A worker that neither waited nor moved SATURATED of its share
keeps what it moved, with HEADROOM to grow, and never less than FLOOR of an equal share (a
worker that gets work starts at once, and is seen waiting at the next look), and never
more than it had; the others
split the rest. When all of them want more, the shares are equal again; when none does,
they stay. The shares
always add up to the whole: a worker given less slows at its next tick, so the sum can pass
the rate only for a tick's time after a change.
With several hosts, a worker's bytes are counted over all of them: the shares then follow
the workers' traffic as a whole, and are never less fair than equal ones.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence

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


class RateBalancer:
    """The coordinator's side: given the workers' latest ticks now and then, their new
    shares (by worker number) when they changed (see the module docstring)."""

    def __init__(self, workers: int, rate: float) -> None:
        self.rate = rate
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
        moved = {tick.worker: tick.bytes + tick.partial_bytes for tick in ticks}
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
