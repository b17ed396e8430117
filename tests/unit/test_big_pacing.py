"""engine/pacing.py, --limit-rate for big bodies: their bytes are taken from their host's
byte bucket as they come, and the bodies of a host in debt are held (paused) until it paid:
libcurl caps each transfer at the worker's whole share, so several at once would go at
several times the rate. On a clock the test moves, with handles that record their pauses."""

from __future__ import annotations

from types import SimpleNamespace

import pycurl
import pytest

from bulkfetch.engine.hosts import RESERVE_S, HostGate
from bulkfetch.engine.pacing import BigPacing
from bulkfetch.engine.parts import Part

RATE = 1000.0  # bytes a second: a reserve is 50, the burst 100


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Handle:
    """Stands in for a pycurl handle: records pause() calls."""

    def __init__(self) -> None:
        self.pauses: list[int] = []

    def pause(self, bitmask: int) -> None:
        self.pauses.append(bitmask)


def pieces(count: int) -> list[Part]:
    ranged = SimpleNamespace(transfer=(None, "big.bin", "http://h/get/big.bin", 1))
    return [Part(ranged, i * 10_000, (i + 1) * 10_000) for i in range(count)]  # type: ignore[arg-type]


@pytest.fixture
def setting() -> tuple[BigPacing, HostGate, Clock]:
    clock = Clock()
    gate = HostGate(byte_rate=RATE, clock=clock)
    return BigPacing(gate), gate, clock


def test_pieces_of_a_host_in_debt_are_held_until_it_paid(setting) -> None:
    pacing, gate, clock = setting
    handles = [Handle() for _ in range(3)]
    active = dict(zip(handles, pieces(3), strict=True))
    pacing.turn(active)
    assert pacing.held == set() and all(h.pauses == [] for h in handles)  # nothing came yet
    for part in active.values():
        part.written += 100  # 300 bytes in a turn: 200 in debt, 0.2 s
    pacing.turn(active)
    assert gate.owed("http://h/x") == pytest.approx(0.2) and RESERVE_S < 0.2
    assert pacing.held == set(handles)
    assert all(h.pauses == [pycurl.PAUSE_RECV] for h in handles)
    pacing.turn(active)  # still in debt: held, nothing asked again
    assert all(h.pauses == [pycurl.PAUSE_RECV] for h in handles)
    clock.now += 0.2  # paid
    pacing.turn(active)
    assert pacing.held == set()
    assert all(h.pauses == [pycurl.PAUSE_RECV, pycurl.PAUSE_CONT] for h in handles)


def test_a_small_debt_holds_nothing(setting) -> None:
    """A body at the rate runs a little into debt between two turns: it is not held for
    that (only for more than RESERVE_S)."""
    pacing, gate, clock = setting
    handle, part = Handle(), pieces(1)[0]
    part.written = 140  # the 100 saved up and 40 more: 0.04 s in debt
    pacing.turn({handle: part})
    for _ in range(10):  # then at the rate
        clock.now += 0.1
        part.written += 100
        pacing.turn({handle: part})
    assert gate.owed("http://h/x") == pytest.approx(0.04) and RESERVE_S >= 0.04
    assert handle.pauses == []


def test_a_body_that_ends_gives_back_its_unused_reserve(setting) -> None:
    pacing, gate, _ = setting
    handle, part = Handle(), pieces(1)[0]
    assert gate.admit((None, "big.bin", "http://h/get/big.bin", 1), big=True)  # takes 50
    pacing.started(part, "http://h/get/big.bin")
    assert part.charged == 50
    part.written = 20
    pacing.ended(handle, part)  # it ended after 20 bytes: 30 back
    assert gate.byte_buckets["http://h"].level == pytest.approx(100 - 50 + 30)


def test_a_held_body_that_ends_is_let_go() -> None:
    clock = Clock()
    pacing = BigPacing(HostGate(byte_rate=RATE, clock=clock))
    handle, part = Handle(), pieces(1)[0]
    part.written = 400
    pacing.turn({handle: part})
    assert handle.pauses == [pycurl.PAUSE_RECV]
    pacing.ended(handle, part)
    assert handle.pauses == [pycurl.PAUSE_RECV, pycurl.PAUSE_CONT] and not pacing.held
