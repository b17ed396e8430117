"""engine/hosts.py: token buckets and the per-host gate, on a clock the test moves."""

from __future__ import annotations

import pytest

from bulkfetch.engine.hosts import HostGate, TokenBucket, host_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def transfer(url: str) -> tuple[object, ...]:
    return (None, url.rsplit("/", 1)[1], url, 1)


@pytest.mark.parametrize("url,host", [
    ("http://a.example:8080/get/x", "http://a.example:8080"),
    ("https://b.example/p/q?x=/y", "https://b.example"),
    ("http://c.example", "http://c.example"),
])
def test_host_of(url: str, host: str) -> None:
    assert host_of(url) == host


def test_bucket_allows_its_burst_then_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(10.0, 2.0, clock)
    assert bucket.take() == 0.0 and bucket.take() == 0.0
    assert bucket.take() == pytest.approx(0.1)
    clock.now += 0.05
    assert bucket.take() == pytest.approx(0.05)  # nothing taken by a refused take
    clock.now += 0.05
    assert bucket.take() == 0.0
    clock.now += 100  # saved up to the burst only
    assert [bucket.take() for _ in range(3)][:2] == [0.0, 0.0]
    with pytest.raises(ValueError):
        TokenBucket(0, 1)


def test_rate_over_a_long_run_is_the_rate() -> None:
    clock = Clock()
    gate = HostGate(max_rps=50, clock=clock)
    started = 0
    waiting = [transfer(f"http://h/get/{i}") for i in range(2000)]
    for _ in range(1000):  # 10 s in steps of 10 ms, the fetcher's way
        for item in waiting[:100]:
            if gate.admit(item):
                started += 1
        waiting = waiting[100:]
        released = gate.release()
        assert all(gate.admit(item) for item, _ in released)  # as the fetcher starts them
        started += len(released)
        clock.now += 0.01
    assert 500 <= started <= 505  # 50/s for 10 s, plus the first tenth of a second's burst


def test_a_pause_holds_one_host_and_keeps_order() -> None:
    clock = Clock()
    gate = HostGate(clock=clock)
    slow, other = "http://slow:1/get/", "http://other:2/get/"
    assert gate.admit(transfer(slow + "a"))
    gate.pause(slow + "a", 3.0)
    assert not gate.admit(transfer(slow + "b"))
    assert not gate.admit(transfer(slow + "c"), big=True)
    assert gate.admit(transfer(other + "d"))  # another host goes on
    assert gate.count == 2 and gate.next_wake() == pytest.approx(3.0)
    clock.now += 2.9
    assert gate.release() == []
    clock.now += 0.2
    released = gate.release()
    assert [(item[2], big) for item, big in released] == [(slow + "b", False),
                                                           (slow + "c", True)]
    assert gate.count == 0 and gate.next_wake() is None
    assert all(gate.admit(item, big) for item, big in released)  # once, not counted again
    assert gate.admit(transfer(slow + "e"))


def test_a_longer_pause_extends_a_shorter_one() -> None:
    clock = Clock()
    gate = HostGate(clock=clock)
    url = "http://h/get/x"
    gate.pause(url, 1.0)
    assert not gate.admit(transfer(url))
    gate.pause(url, 5.0)
    gate.pause(url, 2.0)  # shorter: no effect
    clock.now += 1.5
    assert gate.release() == []
    clock.now += 3.6
    assert len(gate.release()) == 1


def test_rate_limited_release_takes_what_the_rate_allows() -> None:
    clock = Clock()
    gate = HostGate(max_rps=10, clock=clock)  # burst 1
    items = [transfer(f"http://h/get/{i}") for i in range(5)]
    assert gate.admit(items[0])
    assert not any(gate.admit(item) for item in items[1:])
    clock.now += 0.1
    assert [item[2] for item, _ in gate.release()] == ["http://h/get/1"]
    clock.now += 0.25  # a burst of 1: no more than one saved up
    assert [item[2] for item, _ in gate.release()] == ["http://h/get/2"]
    assert gate.next_wake() == pytest.approx(0.1)
    clock.now += 0.1
    assert [item[2] for item, _ in gate.release()] == ["http://h/get/3"]
    gate.clear()
    assert gate.count == 0 and gate.release() == [] and gate.next_wake() is None


def test_byte_rate_holds_a_host_while_in_debt() -> None:
    clock = Clock()
    gate = HostGate(byte_rate=1000, clock=clock)  # 1,000 bytes/s, 100 saved up at most
    url = "http://h/get/"
    assert gate.admit(transfer(url + "a"))
    gate.received(url + "a", 600)  # 500 in debt
    assert not gate.admit(transfer(url + "b"))
    assert gate.next_wake() == pytest.approx(0.5)
    assert gate.admit(transfer("http://other/get/c"))  # another host's bytes are its own
    clock.now += 0.5
    assert [item[2] for item, _ in gate.release()] == [url + "b"]
    gate.received("http://no-limit/x", 10**9)
    assert gate.admit(transfer("http://no-limit/y")) is False  # a billion bytes owed
    assert HostGate().received("http://h/x", 10**9) is None  # no --limit-rate: not counted


def test_byte_rate_over_a_long_run_is_the_rate() -> None:
    clock = Clock()
    gate = HostGate(byte_rate=50_000, clock=clock)
    received = 0
    waiting = [transfer(f"http://h/get/{i}") for i in range(5000)]
    for _ in range(1000):  # 10 s; bodies of 1,000 bytes arrive as soon as started
        started = [item for item in waiting[:50] if gate.admit(item)]
        started += [item for item, _ in gate.release() if gate.admit(item)]
        waiting = waiting[50:]
        for item in started:
            gate.received(item[2], 1000)
            received += 1000
        clock.now += 0.01
    assert 500_000 <= received <= 500_000 * 1.05 + 5_000 + 1000


def test_a_failed_first_transfer_does_not_hold_the_host() -> None:
    clock = Clock()
    gate = HostGate(byte_rate=1000, clock=clock)
    url = "http://h/get/"
    assert gate.admit(transfer(url + "a"))  # its size is not known yet
    assert not gate.admit(transfer(url + "b"))  # waits for the first body
    gate.ended(url + "a")  # ... which never comes: a 404
    clock.now += 0.02
    assert [item[2] for item, _ in gate.release()] == [url + "b"]


def test_a_big_body_takes_its_bytes_as_they_come() -> None:
    """A big body starts with a reserve taken (RESERVE_S of the rate) and no estimate
    needed; its further bytes are taken as they flow, and it leaves the small bodies'
    estimate alone."""
    clock = Clock()
    gate = HostGate(byte_rate=1000, clock=clock)  # 100 saved up at most; a reserve is 50
    url = "http://h/get/"
    bucket = lambda: gate.byte_buckets["http://h"].level  # noqa: E731
    assert gate.admit(transfer(url + "small"))  # its size is not known yet ...
    assert gate.admit(transfer(url + "big"), big=True)  # ... which holds no big body
    assert gate.reserved == 50 and bucket() == pytest.approx(50)
    gate.flowed(url + "big", 40)
    assert gate.admit(transfer(url + "big2"), big=True)  # 10 left: may start
    assert bucket() == pytest.approx(-40)
    assert not gate.admit(transfer(url + "big3"), big=True)  # in debt
    assert not gate.admit(transfer(url + "big4"), big=True)
    clock.now += 0.05
    # the debt paid: one starts, and its reserve holds the next one back
    assert [item[2] for item, _ in gate.release()] == [url + "big3"]
    assert bucket() == pytest.approx(-40)
    gate.give_back(url + "big3", 50)  # it came to nothing
    assert bucket() == pytest.approx(10)
    gate.give_back(url + "big3", 500)  # no more than the burst is saved
    assert bucket() == pytest.approx(100)
    assert gate.mean_size == {}  # no big body is an estimate of the small ones


def test_an_attempt_stopped_at_its_headers_gives_back_what_it_took() -> None:
    """A body over --spool-above is stopped at its headers and fetched again as a big one:
    the first attempt ends without a body and frees the estimate (it held the host before,
    for good), and what its start took is given back (the body was charged twice)."""
    clock = Clock()
    gate = HostGate(byte_rate=1000, clock=clock)
    url = "http://h/get/"
    assert gate.admit(transfer(url + "a"))
    assert not gate.admit(transfer(url + "b"))  # waits for the first body
    gate.ended(url + "a", sent=False)
    clock.now += 0.02
    assert [item[2] for item, _ in gate.release()] == [url + "b"]
    gate.received(url + "b", 80)  # the estimate: 80 bytes a body
    assert gate.byte_buckets["http://h"].level == pytest.approx(20)
    assert gate.admit(transfer(url + "c"))  # takes 80: 60 in debt
    assert gate.byte_buckets["http://h"].level == pytest.approx(-60)
    gate.ended(url + "c", sent=False)  # ... given back
    assert gate.byte_buckets["http://h"].level == pytest.approx(20)
    assert gate.admit(transfer(url + "c"), big=True)  # so its big body may start now


def test_bodies_in_flight_while_the_mean_moves_are_charged_their_size() -> None:
    """Small bodies start charged the host's mean body size and are stored later, when the
    mean may have moved: each store settles what the starts in flight took on average
    (the ledger), so every byte stored is charged once. Corrected by the mean at the store
    instead, ten bodies of 10,000 bytes started while the mean was 100 were charged about
    two thirds of their bytes (65,481 of 100,000)."""
    clock = Clock()
    gate = HostGate(byte_rate=1e9, clock=clock)  # (never in debt here: every one starts)
    url = "http://h/get/"
    bucket = gate._bytes("http://h")
    assert gate.admit(transfer(url + "first"))
    gate.received(url + "first", 100)  # the mean: 100
    started = [transfer(f"{url}{i}") for i in range(10)]
    assert all(gate.admit(item) for item in started)  # each takes 100
    for item in started:  # the mean rises with each one stored
        gate.received(item[2], 10_000)
    assert bucket.level == pytest.approx(bucket.burst - 100 - 10 * 10_000)
    assert gate.ledger["http://h"] == [0, 0.0]
    # one ended without a body gives back what it took, another's failure keeps it taken
    assert gate.admit(transfer(url + "x")) and gate.admit(transfer(url + "y"))
    taken = gate.mean_size["http://h"]
    level = bucket.level
    gate.ended(url + "x", sent=False)
    assert bucket.level == pytest.approx(level + taken)
    gate.ended(url + "y")
    assert bucket.level == pytest.approx(level + taken)
    assert gate.ledger["http://h"] == [0, 0.0]


def test_a_new_byte_rate_keeps_what_was_saved_or_owed() -> None:
    clock = Clock()
    gate = HostGate(byte_rate=1000, clock=clock)
    url = "http://h/get/"
    assert gate.admit(transfer(url + "a"))
    gate.received(url + "a", 600)  # 500 in debt at 1,000/s
    gate.set_byte_rate(5000)  # another share of --limit-rate: 500 owed at 5,000/s
    assert gate.byte_rate == 5000 and gate.reserved == pytest.approx(250)
    assert gate.owed(url + "b") == pytest.approx(0.1)
    clock.now += 1.0
    assert gate.owed(url + "b") == 0.0
    assert gate.byte_buckets["http://h"].level == pytest.approx(500)  # its new burst
    # a host parked at a low rate is looked at again when the rate rises
    gate.set_byte_rate(10)  # (its burst: 1)
    gate.received(url + "b", 1000)  # 999 owed at 10/s: 99.9 s
    assert not gate.admit(transfer(url + "c"))
    assert gate.next_wake() == pytest.approx(99.9)
    gate.set_byte_rate(1000)
    assert gate.next_wake() == 0.0
    assert gate.release() == []  # still owing, for about a second at the new rate
    assert gate.next_wake() == pytest.approx(0.999)


def test_host_label_drops_credentials() -> None:
    from bulkfetch.engine.hosts import host_label

    assert host_label("http://user:secret@h.example:8080/a/b") == "http://h.example:8080"
    assert host_label("https://h.example/a") == "https://h.example"
    assert "secret" not in host_label("https://u:secret@h")
