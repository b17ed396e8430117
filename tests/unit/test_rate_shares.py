"""--limit-rate's shares between workers (runners/rate_shares.py), on ticks made up here."""

from __future__ import annotations

import pytest

from bulkfetch.models import Tick
from bulkfetch.runners.rate_shares import BALANCE_S, FLOOR, RateBalancer, allocate


def test_equal_shares_when_every_worker_wants_more_and_no_change_when_none_does() -> None:
    assert allocate([0.5, 0.49], [0.5, 0.5], [False, False]) == [0.5, 0.5]  # both used it
    assert allocate([0.0, 0.0], [0.3, 0.7], [True, True]) == [0.5, 0.5]
    assert allocate([0.1, 0.2], [0.3, 0.7], [False, False]) == pytest.approx([0.3, 0.7])


def test_the_worker_with_the_bytes_gets_what_the_idle_one_does_not_use() -> None:
    new = allocate([0.5, 0.0], [0.5, 0.5], [True, False])
    assert new == pytest.approx([1 - FLOOR / 2, FLOOR / 2])
    assert sum(new) == pytest.approx(1.0)


def test_a_worker_that_moves_a_little_keeps_that_with_room_to_grow() -> None:
    # 8 workers: one waits on its share, one moves 0.1 of the rate, six move nothing
    used = [0.125, 0.1] + [0.0] * 6
    new = allocate(used, [0.125] * 8, [True] + [False] * 7)
    assert new[1] == pytest.approx(0.125)  # 0.1 x 1.25, no more than an equal share
    assert new[2:] == pytest.approx([FLOOR / 8] * 6)
    assert new[0] == pytest.approx(1 - 0.125 - 6 * FLOOR / 8)
    assert sum(new) == pytest.approx(1.0)


def test_a_worker_just_under_a_big_share_keeps_it() -> None:
    # one stream held by libcurl's cap moved a little under its share: it keeps the share
    # (it lost half of the rate every other look: nobody wanting more made the shares
    # equal, and a worker not wanting more was capped at an equal share)
    assert allocate([0.82, 0.0], [0.95, 0.05], [False, False]) == pytest.approx([0.95, 0.05])
    assert allocate([0.82, 0.05], [0.95, 0.05], [False, True]) == pytest.approx([0.95, 0.05])


def test_a_worker_paying_off_a_burst_keeps_its_share() -> None:
    # it moved nothing this time (its transfers were held until its debt was paid), but
    # it waited: taking its share away then halved the rate of one big file (seen)
    assert allocate([0.0, 0.0], [0.95, 0.05], [True, False]) == pytest.approx(
        [1 - FLOOR / 2, FLOOR / 2])


def tick(worker: int, moved: int, held: int = 0, partial: int = 0) -> Tick:
    return Tick(worker, bytes=moved, partial_bytes=partial, held_ticks=held)


def test_the_balancer_moves_the_shares_and_says_only_changes() -> None:
    rate = 1000.0
    balancer = RateBalancer(2, rate)
    start = balancer.looked
    assert balancer.look([tick(0, 0), tick(1, 0)], start + BALANCE_S / 2) is None  # too soon
    # worker 0 moved its half and waited; worker 1 nothing
    shares = balancer.look([tick(0, 250, held=3), tick(1, 0)], start + BALANCE_S)
    assert shares == pytest.approx({0: 1 - FLOOR / 2, 1: FLOOR / 2})
    # the same again: no change to send
    later = start + 2 * BALANCE_S
    assert balancer.look([tick(0, 250, held=6, partial=475), tick(1, 0)], later) is None
    # worker 0 is done; worker 1 now waits on its floor: they trade places
    shares = balancer.look([tick(0, 725, held=6), tick(1, 25, held=1)], later + BALANCE_S)
    assert shares == pytest.approx({0: FLOOR / 2, 1: 1 - FLOOR / 2})


def test_a_worker_not_heard_from_yet_keeps_its_share_until_it_is() -> None:
    balancer = RateBalancer(2, 1000.0)
    start = balancer.looked
    # worker 0 alone has ticked, waiting: worker 1 has its half from the start, and
    # giving worker 0 the whole rate then would make them 1.5 times it
    shares = balancer.look([tick(0, 250, held=1)], start + BALANCE_S)
    assert shares == pytest.approx({0: 1 - FLOOR / 2, 1: FLOOR / 2})
    # worker 1's first tick: its bytes so far all count for this interval
    shares = balancer.look([tick(0, 250, held=1), tick(1, 500)], start + 2 * BALANCE_S)
    assert shares == pytest.approx({0: FLOOR / 2, 1: 1 - FLOOR / 2})


def test_a_lost_worker_has_no_share_and_its_replacement_one() -> None:
    balancer = RateBalancer(2, 1000.0)
    start = balancer.looked
    # worker 1 was lost (a Ray node gone); worker 2 took its place
    shares = balancer.look([tick(0, 500, held=1), tick(2, 0)], start + BALANCE_S, gone={1})
    assert shares == pytest.approx({0: 1 - FLOOR / 2, 2: FLOOR / 2})
