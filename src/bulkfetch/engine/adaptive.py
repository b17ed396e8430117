"""`--concurrency auto`: how many transfers a worker keeps in flight, found by measuring.

A fixed number is wrong somewhere: 64 in flight is plenty on loopback and a tenth of what
a 100 ms server allows (Little's law: files/s = in flight / latency). The controller
watches what the worker gets for the transfers it keeps in flight and moves the limit:

- slow start: from a gentle few (api.AUTO_START: a small server's accept queue is never
  flooded; a resumed run starts from what its host took, dest/host_memory.py), the limit
  doubles each interval while completed files/s rises by at least RISE (and latency stays
  near its floor), or, while this process is the bottleneck, while each doubling cuts the
  CPU it spends a file (CLIENT_BOUND). Toward a far server (answers FAR_S or more late) it
  grows by one for each answer as it comes (TCP's slow start: twice the limit each round
  trip, so it is filled in a few of its round trips), at most CLOCKED_GROWTH times over an
  interval, until a round trip's quickest answers come an eighth past the floor
  (TCP's HyStart), and only while this process has CPU to spare. The first interval
  whose growth did not pay ends slow start and the limit goes back to the last one that
  paid (where files/s rose but requests queued: to files/s times the latency floor, what
  the server takes by Little's law);
- then steady: -1/10 an interval while latency stays above QUEUEING x its floor and
  QUEUEING_MIN_S past it (requests wait at the server or in this process rather than
  travel), else +1/64 (at least one) while the limit is used; after REPROBE_S without
  congestion, slow start again from there (the server or the path may take more now);
- congestion (429, 503, timeouts, refused connections: more than CONGESTED_SHARE of an
  interval's answers, or any one that asked for a pause) multiplies the limit by BACK_OFF
  at once, at most once an interval, and ends slow start (what got through is then taken
  for the server's cap, so the creep that follows slows before it). Each answer's Retry-After
  pauses the whole host (hosts.py): near a server's cap only a few answers are refused,
  far under the share, yet each costs a pause, so an answer asking for one is congestion
  on its own. And a slow creep toward a cap costs less than probing it often: the limit
  where congestion began is remembered (TCP CUBIC's W_max), the creep slows to +1 every
  NEAR_CAP_S within NEAR of it, and congestion met while creeping or near it backs off by
  NEAR_BACK_OFF only (that limit is the cap; BACK_OFF is for slow start's overshoot).
  Past REPROBE_S near a cap, the reprobe creeps on at the pace far from one instead of
  doubling into it.

An interval lasts at least MIN_INTERVAL_S (START_INTERVAL_S in slow start toward a near
server) and two mean latencies, so each judgement sees the limit it is judging. The limit
only grows while the worker actually used it (enough pages at hand to fill it), never above
`ceiling` (--max-concurrency and the file descriptors this process may open) or below
`floor`.

Over several hosts (host_windows.py) each host's controller watches its own latency, and
the worker's watches files/s alone (`watch_latency` off): a mean latency over hosts moves
with the mix of hosts in flight, not only with queueing, and would shrink the worker's
pool whenever a far host's share grew.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

__all__ = ["Controller"]

RISE = 1.15  # slow start goes on while files/s rises by this factor an interval
# Slow start's growth an interval, at most: on a near server an interval holds hundreds of
# round trips, and one per answer would leap past the judgement that growth paid.
GROWTH = 4
# ... and as the answers come on a far server (completed()), where one per answer is twice
# the limit a round trip: 5.7x over a quarter second 100 ms away, which a cap of GROWTH held
# to 4x (2026-11-29); nearer, 20-30 ms away, a quarter second holds 8-12 round trips, and
# this bounds what one interval may add before it is judged.
CLOCKED_GROWTH = 8
# ... and only on a far server, whose latency floor is at least this: on a near one
# (loopback nginx: 0.3 ms) the client is soon the bottleneck, an interval's doubling
# reaches it within a second, and a 4x step's latency (0.3 ms at 4 in flight, 1.1 ms at
# 64) reads as queueing and ended slow start at 4 (2026-11-29).
FAR_S = 0.005
# A round trip's answers that tell whether they queue (TCP HyStart's N_RTT_SAMPLE)
ROUND_SAMPLES = 8
QUEUEING = 1.5  # latency above floor x this: requests are waiting, not travelling
# ... and above the floor by this much at least: a near server's floor is a few hundred
# microseconds (nginx on loopback: 0.3 ms), and one turn of this process's loop moves a
# latency that much, so 1.5x of it says nothing of the server (it ended slow start at 8 in
# flight at 0.51 ms on a floor of 0.33, 2026-11-29); a small server that queues adds
# milliseconds (python -m http.server: 2-3 ms at 4 in flight).
QUEUEING_MIN_S = 0.001
REPROBE_S = 30.0  # steady this long without congestion: try doubling again
BACK_OFF = 0.7  # the limit after congestion, times the limit (TCP CUBIC's factor)
MIN_INTERVAL_S = 0.25
# ... in slow start toward a near server (answers within FAR_S), where an interval holds
# hundreds of answers: at the steady pace nginx's start from 4 to 64 on loopback took a
# second, half of a 20,000-file run (2026-11-29). Not toward a far one: there growth is one
# per answer, at most GROWTH times an interval, and a tenth of a second of a ThreadingHTTP-
# Server 30 ms away (a dozen answers) grew it past its accept queue.
START_INTERVAL_S = 0.1
# This thread wanting the CPU for CLIENT_BOUND of an interval's wall time (on it, or waiting
# in the run queue for it: thread_cpu()): the client, not the server, sets files/s (nginx on
# loopback). Then more in flight does not raise files/s but spreads each turn of the loop
# over more files, so slow start goes on to CLIENT_BOUND_LIMIT (where a fixed 64 stood, the
# old start) and latency spent waiting here is not the server's queueing. A small server
# (python -m http.server) keeps the client idle: no effect there. The run queue counts
# because the cores are shared: two workers, the main process and a local nginx on two
# cores each ran 50-60% of the time and waited for a core most of the rest, and read as
# idle, the controller stayed at 4-9 in flight, 15% slower than -c 64 (2026-11-29).
CLIENT_BOUND, CLIENT_BOUND_LIMIT = 0.85, 64
# ... and there a doubling paid when it cut the CPU this thread ran a file by this factor
# (or files/s rose by RISE): busy is not enough, a small server on the same cores makes the
# client wait for a core too (python -m http.server: one new connection a file, 300-380 us
# a file at 8 in flight and no less at 16 or 32). Doubled on busy alone, to 64, it overflowed
# that server's accept queue of 5 and stalled a 1.8 s run for a second (2026-11-29), where
# nginx's keep-alive loop ran 70, 61 and 57 us a file at 8, 16 and 32 in flight.
CPU_SAVING = 0.97
MAX_INTERVAL_S = 3.0
# Congestion counts when more than this share of an interval's answers say so: a server
# that throttles a steady few percent whatever the load would otherwise be left at the
# floor, as TCP is on a lossy link.
CONGESTED_SHARE = 0.02
# Fewer in an interval say nothing yet (unless it is MAX_INTERVAL_S old); in slow start,
# twice the limit is enough: from 4 in flight on a 100 ms server, 16 answers take 4 round
# trips, and every round trip of the start counts.
MIN_COMPLETIONS = 16
NEAR = 0.9  # within this share of the limit where congestion began: near the server's cap
NEAR_CAP_S = 3.0  # near it, the creep adds one transfer at most this often
NEAR_BACK_OFF = 0.9  # congestion met near the remembered cap: the limit times this


class Controller:
    def __init__(self, start: int, ceiling: int, floor: int = 4,
                 clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], tuple[float, float]] | None = None,
                 clocked: bool = True) -> None:
        self.floor = max(1, min(floor, ceiling))
        self.ceiling = max(self.floor, ceiling)
        self.limit = min(max(start, self.floor), self.ceiling)
        self.clock = clock
        # (seconds this thread ran, and ran or waited to): is the client the bottleneck,
        # and what does a file cost it?
        self.cpu_clock = cpu_clock or thread_cpu
        self.last_cpu_a_file = math.inf
        # Slow start toward a far server may grow as the answers come (completed()): the
        # caller then acts on `limit` at once (fetcher.py), not only on what decide() says.
        # Not per host (host_windows.py): their gate wakes parked transfers at a sweep.
        self.clocked = clocked
        # the round trip growth as the answers come is in (_grow): how long one takes (the
        # floor that growth began from), since when, its answers and their least latency
        self.round_trip = math.inf
        self.round_began, self.round_answers, self.round_least = -math.inf, 0, math.inf
        self.slow_start = True
        self.floor_latency = math.inf
        self.last_rate = 0.0
        self.paid_limit = self.limit  # the last limit whose doubling raised files/s
        self.steady_since = clock()
        self.cap = 0  # the limit at which congestion last began (0: none seen)
        self.backed_off_to = self.ceiling  # the limit the last back-off set
        self.crept = -math.inf  # when the creep last added near the cap
        self.watch_latency = True  # off: files/s alone decides (see above)
        self.answered = 0  # transfers ended with a body, ever (stragglers.py: it answers)
        self.recent_latency = math.inf  # the mean latency of the last interval with answers
        self._reset(clock(), self.cpu_clock())

    def resume(self, limit: int, floor_latency: float) -> None:
        """Start where a former run's controller for this host ended (dest/host_memory.py):
        at its limit, in the steady phase (no doubling past a cap it may have met), with
        its latency floor when it had one, so queueing shows from the first interval."""
        self.limit = self.paid_limit = min(max(limit, self.floor), self.ceiling)
        self.slow_start = False
        if floor_latency > 0.0:
            self.floor_latency = floor_latency

    def _reset(self, now: float, cpu: tuple[float, float], busy: bool = False) -> None:
        self.started = now
        self.ran_started, self.cpu_started = cpu
        self.completions = 0
        self.latency_sum = 0.0
        self.congestion = 0
        self.told_to_wait = False  # an answer of this interval asked for a pause
        self.answered_before = 0  # answers of this interval before its first congestion
        self.busiest = 0  # most transfers in flight seen this interval
        self.judged_limit = self.limit  # the limit this interval judges
        # Slow start toward a far server grows as answers come (_grow()), not at the
        # interval's end: up to this limit (0: not now; -1: the first answers will tell).
        self.clocked_cap = 0
        if self.slow_start and self._far_growth() and not busy:
            if self.floor_latency == math.inf:
                self.clocked_cap = -1
            else:
                self._clock(self.floor_latency)

    def _far_growth(self) -> bool:
        """Slow start grows as the answers come, once the latency floor says far."""
        return self.clocked and self.watch_latency and self.floor_latency >= FAR_S

    def _clock(self, floor: float) -> None:
        self.clocked_cap = min(self.ceiling, self.limit * CLOCKED_GROWTH)
        self.round_trip = floor
        # an eighth past the floor, as TCP's HyStart reads a round trip's growth: far
        # tighter than QUEUEING (50 ms past a 100 ms floor), which let growth run on to
        # 4,096 where this process had run out of CPU at 2,000 and answers took 160 to
        # 210 ms (2026-11-29)
        self.clocked_latency = floor + max(QUEUEING_MIN_S, floor / 8)

    def _first_answers(self, count: int, latency_sum: float) -> None:
        """The run's first answers: a far server's slow start grows from them on, not
        from the first interval's end (two round trips later). Their latency stands for
        the floor here only: the floor itself is an interval's mean, as a few answers of a
        server whose answers vary (20-45 ms at any load) may be its quickest (a near
        server's first answers that read as far, their connects counted, grow it
        CLOCKED_GROWTH times at most, until the interval ends)."""
        latency = latency_sum / count
        if latency < FAR_S or not self.watch_latency:  # (turned off since _reset)
            self.clocked_cap = 0
            return
        self._clock(latency)

    # -- what the fetcher tells it ------------------------------------------------------
    def completed(self, count: int, latency_sum: float) -> None:
        """`count` transfers ended; `latency_sum`: their seconds from start to end."""
        self.completions += count
        self.latency_sum += latency_sum
        self.answered += count
        if not (self.clocked_cap and count):
            return
        if self.clocked_cap < 0:
            self._first_answers(count, latency_sum)
        if self.clocked_cap:
            self._grow(count, latency_sum)

    def _grow(self, count: int, latency_sum: float) -> None:
        """One more in flight per answer, as it comes (TCP's slow start, clocked by the
        answers): twice the limit a round trip, where growth once an interval gave about 3x
        a quarter second (on a 100 ms server the fill of 2,000 in flight took 1.3 s, half of
        a 20,000-file run, 2026-11-29). Only while the limit is used and the interval is not
        congested, and until a round trip's quickest answers come late (TCP's HyStart: its
        least latency, of ROUND_SAMPLES answers at least, past `clocked_latency`; the least,
        not each, as some servers' answers vary by tens of milliseconds at any load)."""
        now = self.clock()
        if now - self.round_began >= self.round_trip:  # a new round trip
            self.round_began, self.round_least, self.round_answers = now, math.inf, 0
        self.round_least = min(self.round_least, latency_sum / count)
        self.round_answers += count
        if self.busiest < self.limit * 0.9 or self._congested() or (
                self.round_answers >= ROUND_SAMPLES and self.round_least > self.clocked_latency):
            return
        self.limit = min(self.limit + count, self.clocked_cap)

    def congested(self, count: int = 1, told_to_wait: bool = False) -> None:
        """A 429 or 503, a timeout or a refused connection: the server wants less.
        `told_to_wait`: the answer asked for a pause (Retry-After), which the host takes
        whatever share of the answers said so: that interval is congested."""
        if not self.congestion:
            self.answered_before = self.completions
        self.congestion += count
        self.told_to_wait = self.told_to_wait or told_to_wait

    def in_flight(self, count: int) -> None:
        if count > self.busiest:
            self.busiest = count

    # -- deciding -----------------------------------------------------------------------
    def due(self, now: float) -> bool:
        elapsed = now - self.started
        if elapsed >= MAX_INTERVAL_S:
            return True
        quorum, shortest = MIN_COMPLETIONS, MIN_INTERVAL_S
        if self.slow_start:
            quorum = min(MIN_COMPLETIONS, 2 * self.limit)
            if self.completions and self.latency_sum < FAR_S * self.completions:
                shortest = START_INTERVAL_S  # near: doubling, over hundreds of answers
        if elapsed < shortest or self.completions < quorum:
            return self._congested() and elapsed >= shortest
        return elapsed >= 2 * self.latency_sum / self.completions

    def _congested(self) -> bool:
        return self.told_to_wait or \
            self.congestion > CONGESTED_SHARE * (self.completions + self.congestion)

    def _queueing(self, latency: float, busy: bool = False) -> bool:
        """Requests wait rather than travel; not counted while this process is the
        bottleneck below CLIENT_BOUND_LIMIT (they wait here, for their turn on the CPU)."""
        if busy and self.limit <= CLIENT_BOUND_LIMIT:
            return False
        return self.watch_latency and latency > self.floor_latency * QUEUEING and \
            latency > self.floor_latency + QUEUEING_MIN_S

    def decide(self, now: float) -> int:
        """The new limit, from the interval that ends now."""
        elapsed = max(now - self.started, 1e-9)
        rate = self.completions / elapsed
        latency = self.latency_sum / self.completions if self.completions else math.inf
        judged = self.judged_limit  # (the limit now may have grown since: completed())
        used = self.busiest >= judged * 0.9
        cpu = self.cpu_clock()  # (one read of /proc an interval: the next one starts here)
        busy = (cpu[1] - self.cpu_started) / elapsed >= CLIENT_BOUND
        cpu_a_file = (cpu[0] - self.ran_started) / self.completions if self.completions \
            else math.inf
        new = self.limit
        if self.completions:
            self.recent_latency = latency
        if self._congested():
            # Slow start overshoots (it doubled past the cap): back off hard. Congestion met
            # while creeping, or near where it began before, is the cap itself: gently.
            gentle = not self.slow_start and (
                self.limit > self.backed_off_to or (self.cap and self.limit >= self.cap * NEAR))
            factor = NEAR_BACK_OFF if gentle else BACK_OFF
            # A server far over its cap refuses most of a burst: what got through is the
            # better estimate (64 sent to a cap of 8: 8, not 44, then 31, ... each of those
            # steps costing the host a Retry-After pause).
            # (counted from when congestion began: the answers before it, at the lower limits
            # that growth as the answers come passed through, would dilute what got through:
            # 243 sent to a cap of 200 read as 230, 2026-11-29)
            answered = max(self.completions - self.answered_before, self.congestion)
            got_through = 1.0 - self.congestion / answered if answered >= MIN_COMPLETIONS \
                else 1.0
            factor = min(factor, got_through)
            new = max(self.floor, int(self.limit * factor))
            # Slow start's overshoot says where the cap is: what got through of the burst
            # (256 sent to a cap of 200: about 220, not 256, so the creep slows before it).
            self.cap = max(new, int(self.limit * got_through)) if self.slow_start \
                else self.limit
            self.backed_off_to = new
            self.slow_start = False
            self.steady_since = now
        elif self.completions:
            self.floor_latency = min(self.floor_latency, latency)
            if self.slow_start:
                if used and busy and judged < CLIENT_BOUND_LIMIT and (
                        cpu_a_file <= self.last_cpu_a_file * CPU_SAVING
                        or rate >= self.last_rate * RISE):
                    # files/s is this process's: more in flight costs less a file, whether
                    # or not files/s rose (the cores' other users move it), so the limit
                    # reached this way has paid
                    new = self.paid_limit = min(judged * 2, CLIENT_BOUND_LIMIT)
                elif used and rate >= self.last_rate * RISE and \
                        not self._queueing(latency, busy):
                    self.paid_limit = judged
                    if self._far_growth():
                        # grown as the answers came, as far as they were not queueing
                        # (_grow()); not at all while this process was busy: more in
                        # flight would wait for it (doubled on busy, 2,630 went to 4,096
                        # and answers took 240 ms, 2026-11-29)
                        new = self.limit
                    else:
                        # one more per answer of the interval (per host, where a sweep
                        # wakes parked transfers); busy, the client sets the pace and more
                        # in flight buys little: doubling is enough
                        growth = GROWTH if not busy and self.floor_latency >= FAR_S else 2
                        new = max(2 * judged, min(judged + self.completions, growth * judged))
                elif used:  # growth did not pay: back toward the last limit that did
                    self.slow_start = False
                    self.steady_since = now
                    # unless files/s rose but latency says requests queue: then what the
                    # server gave times its latency floor (Little's law, BBR's estimate) is
                    # what it takes, between the limit that paid and this one (599 grown to
                    # 2,096 toward a server that serves 1,200 in flight: 1,200, not 599)
                    new = max(self.paid_limit, min(self.limit, int(rate * self.floor_latency)))
            elif self._queueing(latency, busy):  # waiting, not travelling
                new = self.limit - max(1, self.limit // 10)
            elif used and now - self.steady_since < REPROBE_S:
                if not self.cap or self.limit < self.cap * NEAR:
                    new = self.limit + max(1, self.limit // 64)  # creep up toward trouble
                elif now - self.crept >= NEAR_CAP_S:  # near where it began: slowly
                    new = self.limit + 1
                    self.crept = now
            elif used and now - self.steady_since >= REPROBE_S:
                # the server or the path may take more now: measure again; near a cap it
                # found, by creeping at the pace far from one (doubling there would send a
                # burst the cap refuses, each refusal pausing the host)
                self.steady_since = now
                if self.cap and self.limit >= self.cap * NEAR:
                    self.cap = 0
                    new = self.limit + max(1, self.limit // 64)
                else:
                    self.slow_start = True
                    self.paid_limit = self.limit
                    self.floor_latency = latency
                    new = self.limit * 2
        self.last_rate, self.last_cpu_a_file = rate, cpu_a_file
        self.limit = min(max(new, self.floor), self.ceiling)
        self._reset(now, cpu, busy)
        return self.limit


SCHEDSTAT = "/proc/thread-self/schedstat"  # ns on a CPU, ns waiting in its run queue, ...
_HAS_SCHEDSTAT = os.path.exists(SCHEDSTAT)


def thread_cpu() -> tuple[float, float]:
    """(Seconds the calling thread has run, and run or waited in the run queue to run), by
    Linux's schedstat; where there is none, this process's CPU seconds for both."""
    if _HAS_SCHEDSTAT:
        try:
            with open(SCHEDSTAT, "rb") as stats:
                ran, waited = stats.read().split()[:2]
            return int(ran) / 1e9, (int(ran) + int(waited)) / 1e9
        except (OSError, ValueError):
            pass
    seconds = time.process_time()
    return seconds, seconds


def open_file_ceiling(reserve: int | None = None) -> int:
    """Transfers this process can keep in flight by its file descriptors: the soft
    RLIMIT_NOFILE raised toward the hard one first. Each transfer may hold two, a socket
    and the file a big body streams into; the journal, the sink and the pipes need
    `reserve` more: by default 256, or half of a limit under 512, at least 32 (a worker
    held 23 descriptors besides its sockets, measured)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # a container may refuse: the soft limit stays the ceiling
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    if reserve is None:
        reserve = min(256, max(32, soft // 2))
    return max(1, (soft - reserve) // 2)
