"""engine/host_windows.py and its use by HostGate: a controller per host, each host kept to
its own limit in flight, on a clock the test moves."""

from __future__ import annotations

from bulkfetch.engine.adaptive import GROWTH
from bulkfetch.engine.host_windows import HostWindows
from bulkfetch.engine.hosts import HostGate


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


A, B = "http://a.example:1", "http://b.example:2"


def transfer(host: str, number: int) -> tuple[object, ...]:
    return (None, f"f{number}", f"{host}/get/f{number}", 1)


def gated(start: int = 4) -> tuple[HostGate, HostWindows, Clock]:
    clock = Clock()
    windows = HostWindows(start, 1024, clock=clock)
    gate = HostGate(clock=clock)
    gate.windows = windows
    return gate, windows, clock


def test_a_host_at_its_limit_waits_while_another_goes_on() -> None:
    gate, windows, _ = gated(start=4)
    assert all(gate.admit(transfer(A, i)) for i in range(4))
    held = transfer(A, 4)
    assert not gate.admit(held)  # a's four are in flight
    assert gate.admit(transfer(B, 0))  # b has its own limit
    assert gate.next_wake() is None  # only a transfer ending wakes a full host
    assert gate.release() == []
    gate.done(transfer(A, 0)[2])
    gate.done(transfer(A, 1)[2])
    assert len(gate.wake) == 1  # looked at once, however many of its transfers end
    assert gate.release() == [(held, False)]
    assert gate.admit(held)  # counted once, at its release
    assert windows.busy[A] == 3 and gate.admit(transfer(A, 5))
    assert not gate.admit(transfer(A, 6))


def test_congestion_lowers_only_its_hosts_limit() -> None:
    windows = HostWindows(64, 1024, clock=Clock())
    for host in (A, B):
        for _ in range(64):
            windows.started(host)
    clock = windows.clock
    for _ in range(20):
        windows.completed(A, 0.02)
        windows.completed(B, 0.02)
    windows.congested(A, told_to_wait=True)
    clock.now += 0.3  # type: ignore[attr-defined]
    windows.sweep()
    assert windows.limit(A) < 64 <= windows.limit(B)


def test_a_rising_limit_wakes_the_hosts_parked_transfers() -> None:
    gate, windows, clock = gated(start=4)
    for i in range(4):
        assert gate.admit(transfer(A, i))
    held = transfer(A, 4)
    assert not gate.admit(held)
    for _ in range(20):  # a busy host whose files/s rose: slow start grows it, one an
        windows.completed(A, 0.01)  # answer, at most GROWTH times over
    clock.now += 0.3
    gate.wake_hosts(windows.sweep()[0])
    assert windows.limit(A) == 4 * GROWTH
    assert gate.release() == [(held, False)]


def test_idle_hosts_that_taught_nothing_are_forgotten() -> None:
    """A URL table over a million hosts: each one's entry goes when it goes idle."""
    windows = HostWindows(64, 1024, clock=Clock())
    for number in range(1000):
        host = f"http://h{number}.example"
        windows.started(host)
        windows.ended(host)
    assert windows.controllers == {} and windows.busy == {}
    windows.started(A)
    windows.congested(A, told_to_wait=True)
    windows.clock.now += 0.3  # type: ignore[attr-defined]
    windows.sweep()
    windows.ended(A)
    assert A in windows.controllers  # it learned a cap: kept


def test_the_first_host_keeps_what_the_worker_learned() -> None:
    windows = HostWindows(64, 4096, clock=Clock())
    windows.adopt(A, 900)
    assert windows.limit(A) == 900 and windows.limit(B) == 64


def test_ends_of_transfers_started_before_the_windows_stop_at_zero() -> None:
    gate, windows, _ = gated(start=2)
    gate.done(transfer(A, 0)[2])  # in flight when the second host appeared
    assert windows.busy.get(A, 0) == 0
    assert gate.admit(transfer(A, 1)) and gate.admit(transfer(A, 2))
    assert not gate.admit(transfer(A, 3))


def test_clear_forgets_what_was_in_flight() -> None:
    gate, _, _ = gated(start=1)
    assert gate.admit(transfer(A, 0))
    gate.clear()
    assert gate.admit(transfer(A, 1))


def test_in_flight_and_limits_by_host_as_metrics_show_them() -> None:
    from bulkfetch.engine.hosts import count_by_host

    urls = [f"{A}/get/x", f"{A}/get/y", "http://user:secret@b.example:2/get/z", f"{B}/get/w"]
    hosts, limits = count_by_host(urls, {A: 40, B: 8, "http://user:secret@b.example:2": 9}.get)
    assert hosts == (("http://a.example:1", 2), ("http://b.example:2", 2))  # no credentials
    assert limits == (("http://a.example:1", 40), ("http://b.example:2", 9))
    assert count_by_host(urls)[1] == ()
