"""engine/adaptive.py: the concurrency controller against simulated servers (a clock the
test moves; files/s and latency computed from the limit, as a server would answer)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections import deque

import pytest

from bulkfetch.engine.adaptive import (
    CLOCKED_GROWTH,
    MAX_INTERVAL_S,
    SCHEDSTAT,
    Controller,
    open_file_ceiling,
    thread_cpu,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(controller: Controller, clock: Clock, serve, seconds: float,
          work: int = 10**9) -> list[int]:
    """Run `seconds` in steps of 10 ms; `serve(limit) -> (files/s, latency, share of the
    answers that say congested)`.
    `work` caps the transfers the worker has at hand. Returns the limit after each step."""
    limits = []
    owed = 0.0  # answers due but not whole yet (4 in flight at 100 ms: 0.4 a step)
    for _ in range(int(seconds / 0.01)):
        in_flight = min(controller.limit, work)
        rate, latency, congested = serve(in_flight)
        owed += rate * 0.01
        done = int(owed)
        owed -= done
        controller.in_flight(in_flight)
        if congested and done:  # (the fetcher tells an answer's 503 before its count)
            controller.congested(max(1, int(done * congested)))
        controller.completed(done, done * latency)
        clock.now += 0.01
        if controller.due(clock.now):
            controller.decide(clock.now)
        limits.append(controller.limit)
    return limits


def far_server(latency: float, capacity: float):
    """Answers in `latency` s until `capacity` files/s; beyond, requests queue."""
    def serve(in_flight: int) -> tuple[float, float, bool]:
        rate = min(in_flight / latency, capacity)
        return rate, in_flight / rate, 0.0
    return serve


class BusyClient:
    """This process wanting the CPU all the while (demand = wall time), running
    `cost(in_flight)` seconds a file of the server's answers: (ran, wanted) for the
    controller's cpu_clock, and the server for drive()."""

    def __init__(self, clock: Clock, server, cost) -> None:
        self.clock, self.server, self.cost = clock, server, cost
        self.ran = 0.0

    def cpu(self) -> tuple[float, float]:
        return self.ran, self.clock.now

    def serve(self, in_flight: int) -> tuple[float, float, float]:
        rate, latency, congested = self.server(in_flight)
        self.ran += rate * 0.01 * self.cost(in_flight)
        return rate, latency, congested


def test_a_far_server_is_filled_in_a_few_seconds() -> None:
    clock = Clock()
    controller = Controller(64, 4096, clock=clock)
    limits = drive(controller, clock, far_server(0.1, 12_000), 10.0)
    # Little's law: 12,000 files/s at 100 ms needs 1,200 in flight
    assert 1024 <= limits[-1] <= 2048
    assert next(i for i, limit in enumerate(limits) if limit >= 1024) * 0.01 < 5.0


def test_from_a_gentle_start_a_far_server_is_filled_in_round_trips_not_intervals() -> None:
    """From 4 in flight on a 100 ms server: one more per answer (twice the limit a round
    trip, as TCP's slow start) reaches 1,024 in well under the 2 s that doubling once an
    interval takes; the overshoot past 1,200 (where requests start to queue) comes back to
    what the server served times its latency floor, not to the last limit that paid."""
    clock = Clock()
    controller = Controller(4, 4096, clock=clock, cpu_clock=lambda: (0.0, 0.0))
    limits = drive(controller, clock, far_server(0.1, 12_000), 5.0)
    assert next(i for i, limit in enumerate(limits) if limit >= 1024) * 0.01 < 1.5
    assert min(limits[-100:]) >= 1100 and max(limits[-100:]) <= 2048, limits[-100:]


def round_trips(controller: Controller, clock: Clock, latency, seconds: float,
                until: int = 1 << 30) -> list[int]:
    """Each request answered `latency(in_flight)` seconds after it was sent, as a real one
    is (not a rate at once, as drive()'s), in steps of a millisecond, for `seconds` or until
    the limit reaches `until`. Returns the limit after each step."""
    sent: deque[float] = deque()  # when each request in flight was sent, oldest first
    limits = []
    for _ in range(int(seconds / 0.001)):
        while len(sent) < controller.limit:
            sent.append(clock.now)
        controller.in_flight(len(sent))
        took = latency(len(sent))
        answered = 0
        while sent and sent[0] <= clock.now - took + 1e-9:
            sent.popleft()
            answered += 1
        if answered:
            controller.completed(answered, answered * took)
        clock.now += 0.001
        if controller.due(clock.now):
            controller.decide(clock.now)
        limits.append(controller.limit)
        if controller.limit >= until:
            break
    return limits


def test_a_far_servers_slow_start_grows_as_the_answers_come() -> None:
    """A 100 ms server: growing one per answer as it comes, not once an interval, reaches
    1,024 in flight from 4 in about ten round trips (0.91 s here; 1.25 s growing at each
    interval's end)."""
    clock = Clock()
    controller = Controller(4, 4096, clock=clock, cpu_clock=lambda: (0.0, 0.0))
    round_trips(controller, clock, lambda in_flight: 0.1, 5.0, until=1024)
    assert clock.now < 1.0, clock.now


def test_growth_as_answers_come_stops_where_they_begin_to_queue() -> None:
    """A 100 ms server whose answers come 10 us later for each request in flight (this
    process's CPU running out, as it did at 2,000 in flight): growth stops once answers come
    an eighth past the floor (TCP's HyStart; 1,250 in flight), having doubled at most once
    past it (a round trip's answers tell of the limit before it); at half again the floor
    (QUEUEING) it ran on to the ceiling, 4,096."""
    clock = Clock()
    controller = Controller(4, 4096, clock=clock, cpu_clock=lambda: (0.0, 0.0))
    limits = round_trips(controller, clock, lambda in_flight: 0.1 + in_flight * 1e-5, 3.0)
    assert 1250 <= max(limits) <= 2500, max(limits)


def test_growth_as_answers_come_reads_a_round_trips_quickest_answers() -> None:
    """A server 20 ms away whose answers may come 45 ms late at any load (the small-server
    JSON API here): one slow batch in a round trip whose quickest answers were on time does
    not hold growth; a round trip whose quickest answers (ROUND_SAMPLES of them at least)
    all came late does (TCP's HyStart)."""
    clock = Clock()
    controller = Controller(8, 4096, clock=clock, cpu_clock=lambda: (0.0, 0.0))
    controller.in_flight(8)
    controller.completed(8, 8 * 0.02)  # the first answers: far, 20 ms
    assert controller.limit == 16
    controller.in_flight(16)
    clock.now += 0.005
    controller.completed(8, 8 * 0.045)  # the same round trip: its quickest were on time
    assert controller.limit == 24
    controller.in_flight(24)
    clock.now += 0.02
    controller.completed(8, 8 * 0.045)  # a new round trip, late from its first answers
    assert controller.limit == 24


def test_a_busy_client_does_not_grow_toward_a_far_server() -> None:
    """This process wanting the CPU all the while, 100 ms from its server: more in flight
    would only wait for it. After the first answers' growth (before any interval said
    busy) the limit stays; it does not double each interval."""
    clock = Clock()
    controller = Controller(4, 4096, clock=clock, cpu_clock=lambda: (clock.now, clock.now))
    limits = round_trips(controller, clock, lambda in_flight: 0.1, 2.0)
    assert max(limits) <= 4 * CLOCKED_GROWTH, max(limits)


@pytest.mark.parametrize("client_bound", [True, False], ids=["client-bound", "server-bound"])
def test_a_busy_client_goes_on_to_where_a_turn_of_its_loop_serves_many(
        client_bound: bool) -> None:
    """From a start of 4 against a server that gives no more than 20,000 files/s from 8 in
    flight on: files/s stops rising at 8. When this process is busy all the while (the
    client is the bottleneck: nginx on loopback), each turn of its loop shared by more
    files, the limit goes on to CLIENT_BOUND_LIMIT and stays, though latency then grows
    with it; when it is mostly idle (the server is the bottleneck) it stays near where
    files/s stopped rising: at most a millisecond of queueing past its floor
    (QUEUEING_MIN_S; 28 in flight here, 0.4 ms + 1 ms)."""
    clock = Clock()
    server = far_server(0.0004, 20_000)
    if client_bound:
        client = BusyClient(clock, server, lambda n: 20e-6 + 200e-6 / n)
        controller = Controller(4, 4096, clock=clock, cpu_clock=client.cpu)
        limits, settles = drive(controller, clock, client.serve, 10.0), (56, 72)
    else:
        controller = Controller(4, 4096, clock=clock, cpu_clock=lambda: (clock.now * 0.2,) * 2)
        limits, settles = drive(controller, clock, server, 10.0), (8, 28)
    assert settles[0] <= min(limits[-300:]) and max(limits[-300:]) <= settles[1], limits[-300:]


def test_loopback_stays_near_where_it_started() -> None:
    """A server that is the bottleneck from the start: more in flight only queues."""
    clock = Clock()
    controller = Controller(64, 4096, clock=clock)
    limits = drive(controller, clock, far_server(0.0005, 50_000), 20.0)
    assert max(limits[-500:]) <= 256
    assert min(limits[-500:]) >= 4


def test_congestion_backs_off_and_ends_slow_start() -> None:
    clock = Clock()
    controller = Controller(1024, 4096, clock=clock)

    def throttled(in_flight: int) -> tuple[float, float, bool]:
        # the server takes 200 at once; the rest are refused (503 with Retry-After)
        return in_flight / 0.05, 0.05, max(0.0, 1 - 200 / in_flight)

    limits = drive(controller, clock, throttled, 20.0)
    assert not controller.slow_start
    assert max(limits[-1000:]) <= 400  # probes above 200, is pushed back
    assert min(limits[-1000:]) >= 100


def test_limit_grows_only_when_used() -> None:
    clock = Clock()
    controller = Controller(64, 4096, clock=clock)
    limits = drive(controller, clock, far_server(0.1, 100_000), 5.0, work=40)
    assert limits[-1] == 64  # 40 transfers at hand: a bigger limit would not be used


def test_bounds() -> None:
    clock = Clock()
    controller = Controller(64, 100, clock=clock)
    limits = drive(controller, clock, far_server(0.1, 100_000), 10.0)
    assert max(limits) == 100
    assert Controller(10, 5).limit == 5 and Controller(0, 50).limit == 4


def test_a_steady_trickle_of_throttling_is_not_congestion() -> None:
    clock = Clock()
    controller = Controller(64, 4096, clock=clock)
    controller.in_flight(64)
    controller.congested(15)  # 1.5%
    controller.completed(1000, 1000 * 0.1)  # (a far server: grown as they come)
    clock.now = 0.3
    assert controller.decide(clock.now) == 64 * CLOCKED_GROWTH  # slow start goes on
    assert controller.slow_start


def test_an_interval_waits_for_completions_but_not_forever() -> None:
    clock = Clock()
    controller = Controller(64, 4096, clock=clock)
    clock.now = 0.3
    assert not controller.due(clock.now)  # nothing completed yet
    clock.now = MAX_INTERVAL_S
    assert controller.due(clock.now)
    controller.decide(clock.now)
    controller.congested()
    clock.now += 0.3
    assert controller.due(clock.now)  # a 429 needs no quorum
    assert controller.decide(clock.now) == 44  # 64 x 0.7


def test_open_file_ceiling_raises_the_soft_limit_to_the_hard_one() -> None:
    import resource

    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        soft, hard = before
        if hard != resource.RLIM_INFINITY and soft > 300:
            resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
        ceiling = open_file_ceiling(reserve=256)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if hard != resource.RLIM_INFINITY:
            assert soft == hard and ceiling == (hard - 256) // 2  # a socket and a file each
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


@pytest.mark.parametrize(("limit", "transfers"), [(32, 1), (64, 16), (128, 32), (1024, 384)])
def test_a_small_open_file_limit_keeps_room_for_the_files_beside_the_sockets(
        limit: int, transfers: int) -> None:
    # in a child: a hard limit lowered cannot always be raised again
    code = ("import resource, sys\n"
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n"
            "from bulkfetch.engine.adaptive import open_file_ceiling\n"
            "print(open_file_ceiling())")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60)
    assert child.returncode == 0, child.stderr
    assert int(child.stdout) == transfers


def test_a_server_capped_at_200_in_flight_is_used_near_its_cap() -> None:
    """`serve --max-concurrent 200`: above 200, the excess is refused at once (503)."""
    clock = Clock()
    controller = Controller(64, 4096, clock=clock)
    served = refused = 0.0

    def capped(in_flight: int) -> tuple[float, float, float]:
        nonlocal served, refused
        share = max(0.0, 1 - 200 / in_flight)
        rate = min(in_flight, 200) / 0.02
        served += rate * 0.01
        refused += in_flight / 0.02 * share * 0.01
        return rate, 0.02, share

    limits = drive(controller, clock, capped, 120.0)
    late = limits[-6000:]  # the last minute
    # near the cap it found, it creeps slowly and backs off a little: each probe above 200
    # costs the whole host a Retry-After pause, so few probes and a high plateau
    assert 185 <= sum(late) / len(late) <= 215
    assert refused / (served + refused) < 0.02
    probes = sum(1 for before, after in itertools.pairwise(limits) if after < before)
    assert probes <= 12, probes


def test_a_near_server_is_grown_by_doubling() -> None:
    """A sub-millisecond server (loopback nginx): a 4x step's latency would read as queueing
    and end slow start at its first step; doubling an interval (of START_INTERVAL_S in slow
    start) reaches the client's bound within half a second anyway."""
    clock = Clock()
    controller = Controller(4, 4096, clock=clock, cpu_clock=lambda: (0.0, 0.0))
    limits = drive(controller, clock, far_server(0.0003, 1_000_000), 0.5)
    steps = [limit for limit, _ in itertools.groupby(limits)]
    assert steps[:5] == [4, 8, 16, 32, 64], steps


def test_a_near_servers_latency_moving_by_microseconds_is_not_queueing() -> None:
    """Slow start on a server 0.3 ms away whose latency grows a little with what is in
    flight (this process's loop turn: 0.34 ms at 4, 0.62 ms at 32) while files/s goes on
    rising: under a millisecond past the floor is no queueing (QUEUEING_MIN_S), so the
    limit grows to where files/s stops rising (128), not to where latency passed 1.5x a
    floor of 0.34 ms (16)."""
    clock = Clock()
    controller = Controller(4, 4096, clock=clock, cpu_clock=lambda: (0.0, 0.0))

    def serve(in_flight: int) -> tuple[float, float, float]:
        latency = 0.0003 + in_flight * 0.00001
        return in_flight / latency, latency, 0.0

    limits = drive(controller, clock, serve, 3.0)
    assert min(limits[-100:]) >= 64 and max(limits[-100:]) <= 256, limits[-100:]


def test_a_busy_client_keeps_the_limit_it_doubled_to_when_files_per_s_stops_rising() -> None:
    """Busy all the while (nginx on loopback, the cores shared): files/s rises to 32 in
    flight and stops at 64 (another process took the CPU it freed). The doubling to 64 was
    paid by the CPU a file it saves (one turn of the loop shared by more files), not by
    files/s: the limit stays at 64, not back to 32."""
    clock = Clock()
    client = BusyClient(clock, far_server(0.0003, 110_000), lambda n: 40e-6 + 400e-6 / n)
    controller = Controller(4, 4096, clock=clock, cpu_clock=client.cpu)
    limits = drive(controller, clock, client.serve, 3.0)
    assert min(limits[-100:]) >= 64, limits[-100:]


def test_a_busy_client_does_not_double_where_a_file_costs_it_no_less() -> None:
    """Busy all the while, but because a small server shares its cores (python -m
    http.server: a new connection a file, as dear at 32 in flight as at 8) and files/s
    stops rising at 8: doubling saves nothing, so slow start ends there and never floods
    the server's accept queue with 32 or 64 (what follows is the steady creep, +1 an
    interval)."""
    clock = Clock()
    client = BusyClient(clock, far_server(0.002, 2_500), lambda n: 350e-6)
    controller = Controller(4, 4096, clock=clock, cpu_clock=client.cpu)
    limits = drive(controller, clock, client.serve, 0.6)
    assert not controller.slow_start and max(limits) <= 16, limits
    limits = drive(controller, clock, client.serve, 2.4)
    assert max(limits) < 32, limits


@pytest.mark.skipif(not os.path.exists(SCHEDSTAT), reason="no /proc/thread-self/schedstat")
def test_thread_cpu_counts_the_wait_for_a_shared_core() -> None:
    """A thread that would run all the time, on a core shared with three that spin: it runs
    about a quarter of the time and waits in the run queue the rest. thread_cpu() tells
    both: what it ran (CPU time alone, three quarters idle) and what it wanted (all of it:
    the client is the bottleneck)."""
    core = min(os.sched_getaffinity(0))
    spin = f"import os, time\nos.sched_setaffinity(0, {{{core}}})\n" \
           "end = time.time() + 5\nwhile time.time() < end: pass\n"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(3)]
    box = {}

    def busy() -> None:
        os.sched_setaffinity(0, {core})  # this thread only
        time.sleep(0.5)  # the spinners are running
        wall, (ran, wanted) = time.monotonic(), thread_cpu()
        while time.monotonic() - wall < 1.0:
            pass
        wall = time.monotonic() - wall
        after = thread_cpu()
        box["demand"], box["ran"] = (after[1] - wanted) / wall, (after[0] - ran) / wall

    try:
        thread = threading.Thread(target=busy)
        thread.start()
        thread.join()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert box["ran"] < 0.6, box
    assert box["demand"] > 0.85, box


def test_slow_starts_overshoot_tells_where_the_cap_is() -> None:
    """From a start of 4 toward a server that takes 200 in flight and refuses the rest
    (503 with Retry-After: 1, which pauses the host a second): slow start overshoots once,
    and what got through of that burst is taken for the cap, so the creep after it slows
    before the cap instead of meeting it again a few seconds later (each meeting costs the
    host a paused second)."""
    clock = Clock()
    controller = Controller(4, 4096, clock=clock, cpu_clock=lambda: (0.0, 0.0))
    paused_until = served = 0.0
    limits = []
    for _ in range(int(15 / 0.01)):
        flight = 0 if clock.now < paused_until else controller.limit
        if flight:
            refused = max(0.0, 1 - 200 / flight)
            answers = flight / 0.02 * 0.01
            served += answers * (1 - refused)
            controller.in_flight(flight)
            if refused:  # (told before the count, as the fetcher does)
                controller.congested(max(1, int(answers * refused)), told_to_wait=True)
                paused_until = clock.now + 1.0
            controller.completed(int(answers), int(answers) * 0.02)  # 503s are answers
        clock.now += 0.01
        if controller.due(clock.now):
            controller.decide(clock.now)
        limits.append(controller.limit)
    assert sum(1 for before, after in itertools.pairwise(limits) if after < before) == 1
    assert served >= 0.9 * 180 / 0.02 * 15  # against a fixed 180 from the first moment


def test_a_pause_asked_for_backs_off_however_few_answers_ask_it() -> None:
    """Near a cap only a handful of answers are refused, under CONGESTED_SHARE, yet each
    one's Retry-After pauses the whole host: the limit must come down, not creep on. The
    same share refused without Retry-After (random faults) leaves it where it is."""
    def run(told_to_wait: bool) -> int:
        clock = Clock()
        controller = Controller(100, 4096, clock=clock)
        controller.slow_start = False
        for _ in range(200):  # 2 s: 100 in flight, 20 ms answers, one refusal a step
            controller.in_flight(100)
            controller.completed(50, 50 * 0.02)
            controller.congested(1, told_to_wait=told_to_wait)  # 2% of 51 answers: under
            clock.now += 0.01
            if controller.due(clock.now):
                controller.decide(clock.now)
        return controller.limit

    assert run(told_to_wait=True) < 80
    assert run(told_to_wait=False) >= 100


def test_the_cap_found_by_creeping_is_backed_off_from_gently_and_probed_seldom() -> None:
    """Two workers share a server capped at 200 in flight; each refusal pauses the refused
    worker's host for a second (Retry-After: 1). Against a fixed 90 + 90, the controllers
    must lose little to those pauses: few probes above the cap, a plateau near it."""
    clock = Clock()
    controllers = [Controller(64, 4096, clock=clock) for _ in range(2)]
    paused_until = [0.0, 0.0]
    served = 0.0
    limits: list[list[int]] = [[], []]
    for _ in range(int(120 / 0.01)):
        flights = [0 if clock.now < paused_until[i] else c.limit
                   for i, c in enumerate(controllers)]
        refused_share = max(0.0, 1 - 200 / sum(flights)) if sum(flights) else 0.0
        for i, controller in enumerate(controllers):
            if not flights[i]:
                continue
            answers = flights[i] / 0.02 * 0.01
            served += answers * (1 - refused_share)
            controller.in_flight(flights[i])
            if refused_share:  # (told before the count, as the fetcher does)
                controller.congested(max(1, int(answers * refused_share)), True)
                paused_until[i] = clock.now + 1.0
            # a 503 is an answer too: the fetcher counts every transfer curl completed
            controller.completed(int(answers), int(answers) * 0.02)
        clock.now += 0.01
        for i, controller in enumerate(controllers):
            if controller.due(clock.now):
                controller.decide(clock.now)
            limits[i].append(controller.limit)
    fixed = 180 / 0.02 * 120  # 90 + 90 in flight for the whole run
    assert served >= 0.9 * fixed, served / fixed
    late = [a + b for a, b in zip(limits[0][-6000:], limits[1][-6000:], strict=True)]
    assert 180 <= sum(late) / len(late) <= 205


def test_a_burst_mostly_refused_backs_off_to_what_got_through() -> None:
    """64 sent to a server that takes 8: the limit goes to 8 at once, not 44, 31, 21, ...
    (each step would cost the host a Retry-After pause)."""
    clock = Clock()
    controller = Controller(64, 4096, floor=1, clock=clock)
    controller.in_flight(64)
    controller.congested(56, told_to_wait=True)  # (told before the count, as the fetcher)
    controller.completed(64, 64 * 0.02)  # every answer, 503s among them
    clock.now += 0.3
    assert controller.decide(clock.now) == 8
