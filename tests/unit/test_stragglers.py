"""Which transfers in flight get a second try (engine/stragglers.py), with fake handles whose
libcurl clock the test sets."""

from __future__ import annotations

import math

import pycurl
import pytest

from bulkfetch.engine import stragglers
from bulkfetch.engine.stragglers import Stragglers


class FakeHandle:
    def __init__(self, waited: float) -> None:
        self.waited = waited  # libcurl's TOTAL_TIME: 0 while still connecting

    def getinfo(self, what: int) -> float:
        assert what == pycurl.TOTAL_TIME
        return self.waited


def host_of(url: str) -> str:
    return url.split("/")[2]


def watching(answered: int = 1000, latency: float = 0.01):
    return lambda host: (answered, latency)


def flight(*handles: FakeHandle, url: str = "http://a/x", begun: bool = False):
    return [(handle, ("transfer", id(handle)), url, begun) for handle in handles]


def test_a_silent_transfer_is_hedged_once_past_the_floor_and_its_hosts_latencies() -> None:
    book = Stragglers(connect_s=10.0)
    young, old = FakeHandle(0.05), FakeHandle(1.2)
    found = book.scan(0.0, flight(young, old), host_of, watching(latency=0.01))
    assert found.hedge == [old] and found.redial == []
    book.pair(old, FakeHandle(0.0))
    # a slow host: 1.2 s is not 8 of its 0.2 s latencies
    slow = Stragglers(connect_s=10.0)
    assert slow.scan(0.0, flight(old), host_of, watching(latency=0.2)).hedge == []


def test_a_transfer_already_answering_or_already_hedged_is_left_alone() -> None:
    book = Stragglers(connect_s=10.0)
    answering = FakeHandle(5.0)
    assert book.scan(0.0, flight(answering, begun=True), host_of, watching()).hedge == []
    paired, hedge = FakeHandle(5.0), FakeHandle(0.05)
    book.pair(paired, hedge)
    assert book.scan(1.0, flight(paired, hedge), host_of, watching()).hedge == []


def test_silent_transfers_of_a_host_that_answers_stop_counting_against_the_limit() -> None:
    """Past EXCUSE_FACTOR latencies (and its floor) a silent transfer is excused, and each
    pair's first: the worker opens as many more handles. Not those of a host that answered
    nobody since: more requests would only join the silence."""
    book = Stragglers(connect_s=10.0)
    fresh, late, later = FakeHandle(0.01), FakeHandle(0.05), FakeHandle(0.06)
    first, hedge = FakeHandle(0.5), FakeHandle(0.01)
    book.pair(first, hedge)
    found = book.scan(0.0, flight(fresh, late, later, first, hedge), host_of,
                      watching(latency=0.01))
    assert found.excused == 3 and found.hedge == []  # late, later, and the pair's first
    book.scan(1.0, flight(FakeHandle(0.05)), host_of, watching(answered=2000))  # seen at t=1
    quiet = book.scan(2.0, flight(FakeHandle(0.5)), host_of, watching(answered=2000))
    assert quiet.excused == 1  # (the pair still out) nothing new: sent after the last answer


def test_scans_come_every_few_latencies_within_bounds() -> None:
    book = Stragglers(connect_s=10.0)
    book.plan_next(10.0, 0.001)
    assert book.next_scan == pytest.approx(10.0 + stragglers.SCAN_MIN_S)
    book.plan_next(10.0, 0.06)
    assert book.next_scan == pytest.approx(10.12)
    book.plan_next(10.0, math.inf)
    assert book.next_scan == pytest.approx(10.0 + stragglers.SCAN_MAX_S)


def test_a_hedge_as_silent_as_its_first_is_hedged_in_its_turn_and_the_first_dropped() -> None:
    book = Stragglers(connect_s=10.0)
    first, hedge = FakeHandle(5.0), FakeHandle(2.0)
    book.pair(first, hedge)
    found = book.scan(1.0, flight(first, hedge), host_of, watching())
    assert (found.drop, found.hedge) == ([first], [hedge])
    assert not book.twin  # the hedge carries the transfer alone, to be paired anew
    assert book.hedged == 1  # counted when paired (pair() adds the next)


def test_hedges_stay_within_a_share_of_the_hosts_answers() -> None:
    book = Stragglers(connect_s=10.0)
    silent = [FakeHandle(2.0) for _ in range(100)]
    found = book.scan(0.0, flight(*silent), host_of, watching(answered=200))
    assert len(found.hedge) == int(stragglers.SHARE * 200) + stragglers.BURST  # 14


def test_a_host_that_answered_nothing_since_the_transfer_was_sent_gets_no_hedge() -> None:
    """A host that went quiet for everyone (a pause, not one lost request): one scan sees
    its count, the next sees it unchanged, and transfers sent after that change wait."""
    book = Stragglers(connect_s=10.0)
    watch = watching(answered=500, latency=0.1)  # a hedge's wait: 0.8 s
    book.scan(0.0, flight(FakeHandle(1.5)), host_of, watch)  # the count, seen at t=0
    # t=3: nothing answered since t=0; a transfer sent at t=1.5 (waited 1.5) is not hedged,
    # one sent before t=0 (waited 4) is: the host answered after it was sent
    late, early = FakeHandle(1.5), FakeHandle(4.0)
    assert book.scan(3.0, flight(late, early), host_of, watch).hedge == [early]
    # ... until it waited QUIET times a hedge's wait: then every transfer in flight may be
    # a silent one, and nothing else would end the wait
    late.waited = stragglers.QUIET * 0.8
    assert book.scan(1.5 + late.waited, flight(late), host_of, watch).hedge == [late]


def test_a_connect_unanswered_past_its_allowance_is_dialled_again_with_a_doubling_wait() -> None:
    book = Stragglers(connect_s=10.0)
    stuck = FakeHandle(0.0)
    in_flight = flight(stuck)
    watch = watching(latency=0.002)  # loopback: the allowance is the floor, 0.3 s
    assert book.scan(0.0, in_flight, host_of, watch).redial == []  # first seen
    assert book.scan(0.2, in_flight, host_of, watch).redial == []
    assert book.scan(0.4, in_flight, host_of, watch).redial == [stuck]
    assert book.scan(0.8, in_flight, host_of, watch).redial == []  # now 0.6 s
    assert book.scan(1.0, in_flight, host_of, watch).redial == [stuck]
    assert book.redialed == 2


def test_connects_are_dialled_again_only_below_the_connect_timeout_and_after_an_answer() -> None:
    stuck = FakeHandle(0.0)
    short = Stragglers(connect_s=0.25)  # --connect-timeout under the floor: libcurl's own
    for now in (0.0, 1.0, 2.0):
        assert short.scan(now, flight(stuck), host_of, watching(latency=0.001)).redial == []
    unknown = Stragglers(connect_s=10.0)  # the host never answered: nothing to compare with
    for now in (0.0, 1.0, 2.0):
        assert unknown.scan(now, flight(stuck), host_of,
                            watching(answered=0, latency=math.inf)).redial == []


def test_a_handle_carrying_a_new_transfer_starts_a_new_clock() -> None:
    book = Stragglers(connect_s=10.0)
    handle = FakeHandle(0.0)
    watch = watching(latency=0.001)
    book.scan(0.0, [(handle, "first", "http://a/1", False)], host_of, watch)
    assert book.scan(0.5, [(handle, "second", "http://a/2", False)], host_of, watch).redial == []


@pytest.mark.parametrize("winner_is_hedge", [True, False])
def test_the_first_answer_of_a_pair_wins_and_drops_the_other(winner_is_hedge: bool) -> None:
    book = Stragglers(connect_s=10.0)
    first, second = FakeHandle(2.0), FakeHandle(0.0)
    book.pair(first, second)
    winner, loser = (second, first) if winner_is_hedge else (first, second)
    assert book.settle(winner, answered=True) is loser
    assert book.dropped == {loser} and not book.twin
    assert (book.hedged, book.won) == (1, 1 if winner_is_hedge else 0)


def test_a_failed_half_of_a_pair_leaves_the_other_alone() -> None:
    book = Stragglers(connect_s=10.0)
    first, second = FakeHandle(2.0), FakeHandle(0.0)
    book.pair(first, second)
    assert book.settle(second, answered=False) is second
    assert not book.dropped and not book.twin and book.won == 0


def test_the_book_of_hosts_stays_small_over_any_number_of_hosts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stragglers, "HOSTS_KEPT", 8)
    book = Stragglers(connect_s=10.0)
    for number in range(50):  # a URL list's hosts, one straggler each, one after another
        book.scan(float(number), flight(FakeHandle(0.05), url=f"http://h{number}/x"),
                  host_of, watching())
        assert len(book.hosts) <= 9
    # the hosts of the last scan keep their records (their hedges still count)
    both = flight(FakeHandle(2.0), url="http://h49/x") + flight(FakeHandle(2.0),
                                                                url="http://h48/x")
    book.scan(60.0, both, host_of, watching())
    assert {"h48", "h49"} <= set(book.hosts)
