"""Stragglers under `--concurrency auto`: which small transfers in flight get a second try.

Looked for every few latencies (SCAN_FACTOR), by what libcurl already measures of a
transfer under way (its TOTAL_TIME grows once it is connected; while it is still
connecting, the scans' own clock): nothing is paid per file. Two kinds:

- **Silent after its request.** Connected, no answer begun, for FACTOR times its host's
  recent latency (and FLOOR_S at least) while the host answered others since it was sent:
  a stuck backend, a lost packet, a request the server left unanswered (or, if the host
  answered nobody since, QUIET times longer: then every transfer in flight may be a
  silent one, and without a hedge none would end before --idle-timeout). It is hedged: the
  same request again on another connection; the first answer wins and the other transfer
  is dropped. Before that, from EXCUSE_FACTOR latencies on, it no longer counts against
  the limit (the pool has a handle more), so it holds up nothing but its own page. One
  silent request then costs about FACTOR latencies, not --idle-timeout (30
  s) of a run's tail. Bounded: a file has two requests in flight at most (a hedge as
  silent as its first is hedged in its turn, and the first dropped), and a host's hedges
  stay under SHARE of its answers (plus BURST); every request bulkfetch makes is a GET, so
  asking twice changes nothing on the server.
- **Still connecting.** A full accept queue drops the SYN, and the kernel sends it again
  after 1 s, then 3 s, 7 s: a run on loopback would wait seconds for a millisecond path.
  Past CONNECT_FACTOR times the host's recent latency (CONNECT_FLOOR_S at least) the
  connect is dialled again, the allowance doubling with each redial of one transfer until
  it reaches --connect-timeout, which stays the upper bound (libcurl's own timer then). A
  redial also tells the host's controller it is congested: its queue overflowed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pycurl

# In-flight transfers are looked at every SCAN_FACTOR times the worker's recent latency,
# within these bounds: often enough on loopback, cheaply with thousands far away.
SCAN_MIN_S, SCAN_MAX_S, SCAN_FACTOR = 0.05, 0.2, 2.0
# A transfer silent this long (and this many times its host's recent latency) while the
# host answers others stops counting against the limit: the worker opens another handle,
# so a silent request never costs throughput while it waits for its hedge.
EXCUSE_FLOOR_S, EXCUSE_FACTOR = 0.02, 4.0
FLOOR_S = 0.1  # never hedge a transfer younger than this ...
FACTOR = 8.0  # ... or than this many times its host's recent mean latency
SHARE = 0.05  # a host's hedges: at most this share of its answers ...
BURST = 4  # ... plus this many
# A host that answered nothing since a transfer was sent (paused for everyone, or every
# transfer in flight silent) gets a hedge only once the transfer waited this many times
# longer than a hedge's wait.
QUIET = 2.0
CONNECT_FLOOR_S = 0.3  # never dial again a connect younger than this ...
CONNECT_FACTOR = 4.0  # ... or than this many times its host's recent mean latency

# Hosts whose record is kept between scans when more than this many were seen (a URL list
# of millions of hosts): only those with a straggler in the last scan then stay.
HOSTS_KEPT = 4096
_TOTAL_TIME = pycurl.TOTAL_TIME

Handle = Any  # a pycurl.Curl (a fake one in the unit tests)
# (host's answers so far, its recent mean latency in seconds: inf before an answer)
Watch = Callable[[str], tuple[int, float]]


@dataclass
class HostRecord:
    answered: int  # the host's answers when a scan last looked
    changed_at: float  # when a scan first saw that count (the host answered by then)
    hedged: int = 0


@dataclass
class Connecting:
    transfer: object  # the transfer the handle carries (a handle is reused: checked by id)
    since: float  # when a scan first saw it connecting (or it was dialled again)
    redials: int = 0


@dataclass
class Found:
    hedge: list[Handle] = field(default_factory=list)
    drop: list[Handle] = field(default_factory=list)  # first halves of silent pairs
    redial: list[Handle] = field(default_factory=list)
    # Transfers silent past their excuse and not paired, and firsts of pairs: not counted
    # against the limit (see EXCUSE_FLOOR_S).
    excused: int = 0


@dataclass
class Stragglers:
    """The book of one worker's stragglers. `twin`: each hedged transfer's handle and its
    hedge's, both ways; `dropped`: handles whose transfer a twin won during the current
    batch of completions (their own completion, if already read, is ignored)."""

    connect_s: float  # --connect-timeout: the allowance never reaches it
    twin: dict[Handle, Handle] = field(default_factory=dict)
    seconds: set[Handle] = field(default_factory=set)  # the hedges of the pairs
    dropped: set[Handle] = field(default_factory=set)
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    connecting: dict[Handle, Connecting] = field(default_factory=dict)
    next_scan: float = 0.0
    hedged: int = 0  # hedges sent
    won: int = 0  # hedges that answered first
    redialed: int = 0

    def scan(self, now: float, in_flight: Iterable[tuple[Handle, object, str, bool]],
             host_of: Callable[[str], str], watch: Watch) -> Found:
        """The stragglers among `in_flight` (handle, its transfer, url, whether its answer
        has begun) worth a second try now; `watch(host)`: see Watch."""
        found = Found(excused=len(self.seconds))  # each pair's first is excused
        connecting: dict[Handle, Connecting] = {}
        looked: set[str] = set()  # hosts with a straggler this scan
        twin = self.twin
        for handle, transfer, url, begun in in_flight:
            if begun or (handle in twin and handle not in self.seconds):
                continue  # (a hedge silent in its turn: below)
            waited = handle.getinfo(_TOTAL_TIME)
            if waited == 0.0:  # not connected yet (libcurl's clock starts counting then)
                seen = self.connecting.get(handle)
                if seen is None or seen.transfer is not transfer:
                    seen = Connecting(transfer, now)
                connecting[handle] = seen
                if now - seen.since >= self._allowance(watch(host_of(url))[1], seen.redials):
                    seen.since, seen.redials = now, seen.redials + 1
                    found.redial.append(handle)
                continue
            if waited < EXCUSE_FLOOR_S:
                continue
            host = host_of(url)
            answered, latency = watch(host)
            if waited < EXCUSE_FACTOR * latency:
                continue
            record = self._record(host, answered, now)
            looked.add(host)
            alive = record.changed_at >= now - waited  # it answered since this was sent
            if alive and handle not in twin:
                found.excused += 1
            due = max(FLOOR_S, FACTOR * latency)
            if waited < due:
                continue
            if (alive or waited >= QUIET * due) and record.hedged < SHARE * answered + BURST:
                if handle in twin:  # silent too: the first goes, this one is hedged anew
                    found.drop.append(self._unpair(handle))
                record.hedged += 1
                found.hedge.append(handle)
        self.connecting = connecting
        self.redialed += len(found.redial)
        if len(self.hosts) > HOSTS_KEPT:  # memory stays flat over any number of hosts
            self.hosts = {host: self.hosts[host] for host in looked}
        return found

    def plan_next(self, now: float, latency: float) -> None:
        """The next scan, by the worker's recent mean `latency` (inf before an answer)."""
        self.next_scan = now + min(SCAN_MAX_S, max(SCAN_MIN_S, SCAN_FACTOR * latency))

    def _allowance(self, latency: float, redials: int) -> float:
        """Seconds a connect may take before it is dialled again (inf: never, before the
        host answered, or once the allowance would reach --connect-timeout)."""
        allowance = max(CONNECT_FLOOR_S, CONNECT_FACTOR * latency) * 2 ** redials
        return allowance if allowance < self.connect_s else float("inf")

    def _record(self, host: str, answered: int, now: float) -> HostRecord:
        record = self.hosts.get(host)
        if record is None:  # (first look: it answered, some time: let it count as now)
            record = self.hosts[host] = HostRecord(answered, now)
        elif answered > record.answered:
            record.answered, record.changed_at = answered, now
        return record

    def pair(self, first: Handle, second: Handle) -> None:
        self.twin[first] = second
        self.twin[second] = first
        self.seconds.add(second)
        self.hedged += 1

    def _unpair(self, second: Handle) -> Handle:
        """`second`, a hedge as silent as the transfer it doubled: the pair is undone and
        the first returned, to be dropped; the hedge goes on as the transfer."""
        first = self.twin.pop(second)
        del self.twin[first]
        self.seconds.discard(second)
        return first

    def settle(self, handle: Handle, answered: bool) -> Handle:
        """`handle`, one of a pair, ended. With an answer (`answered`) it wins: its twin,
        returned, is to be dropped, and its end is ignored if it was read already in this
        batch of completions (`dropped`). Without one (a transfer error) it is itself the
        one to drop, returned, and its twin goes on alone."""
        other = self.twin.pop(handle)
        del self.twin[other]
        self.seconds.discard(other)
        if handle in self.seconds:
            self.seconds.discard(handle)
            self.won += answered
        if not answered:
            return handle
        self.dropped.add(other)
        return other

    def clear(self) -> None:
        self.twin.clear()
        self.seconds.clear()
        self.dropped.clear()
        self.connecting.clear()
