"""--limit-rate's shares between workers (runners/rate_shares.py), on ticks made up here."""

from __future__ import annotations

import pytest

from bulkfetch.models import Tick
from bulkfetch.runners.rate_shares import (
    BALANCE_S,
    FLOOR,
    RateBalancer,
    RateShares,
    allocate,
    bytes_moved,
)


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


def tick(worker: int, moved: int, held: int = 0, partial: int = 0, done: int = 0) -> Tick:
    return Tick(worker, files_ok=done, bytes=moved, partial_bytes=partial, held_ticks=held)


def test_the_balancer_moves_the_shares_and_says_only_changes() -> None:
    rate = 1000.0
    balancer = RateBalancer(2, rate, bytes_moved)
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
    balancer = RateBalancer(2, 1000.0, bytes_moved)
    start = balancer.looked
    # worker 0 alone has ticked, waiting: worker 1 has its half from the start, and
    # giving worker 0 the whole rate then would make them 1.5 times it
    shares = balancer.look([tick(0, 250, held=1)], start + BALANCE_S)
    assert shares == pytest.approx({0: 1 - FLOOR / 2, 1: FLOOR / 2})
    # worker 1's first tick: its bytes so far all count for this interval
    shares = balancer.look([tick(0, 250, held=1), tick(1, 500)], start + 2 * BALANCE_S)
    assert shares == pytest.approx({0: FLOOR / 2, 1: 1 - FLOOR / 2})


def test_a_lost_worker_has_no_share_and_its_replacement_one() -> None:
    balancer = RateBalancer(2, 1000.0, bytes_moved)
    start = balancer.looked
    # worker 1 was lost (a Ray node gone); worker 2 took its place
    shares = balancer.look([tick(0, 500, held=1), tick(2, 0)], start + BALANCE_S, gone={1})
    assert shares == pytest.approx({0: 1 - FLOOR / 2, 2: FLOOR / 2})


def test_both_limits_move_each_by_its_own_unit() -> None:
    """--limit-rate by bytes, --max-rps by requests done (files ok, failed, retried): one
    worker with all the small files and another with one big file each get the limit
    they are held by, and the pair of shares goes to every worker when either moves."""
    shares = RateShares(2, byte_rate=1000.0, request_rate=100.0)
    start = shares.bytes.looked  # type: ignore[union-attr]
    shares.requests.looked = start  # type: ignore[union-attr]
    # worker 0: 50 requests (its whole half of 100/s), few bytes; worker 1: bytes only
    found = shares.look([tick(0, 10, done=25), tick(1, 250)], start + BALANCE_S)
    assert found is not None
    # (bytes, requests): worker 0 keeps 1.25x the bytes it moved (0.02 of the rate)
    assert found[0] == pytest.approx((0.025, 1 - FLOOR / 2))
    assert found[1] == pytest.approx((0.975, FLOOR / 2))
    only_bytes = RateShares(2, byte_rate=1000.0, request_rate=0.0)
    assert only_bytes.requests is None
    found = only_bytes.look([tick(0, 0), tick(1, 250)], only_bytes.bytes.looked + BALANCE_S)
    assert found is not None and set(found) == {0, 1}
    assert found[0] == pytest.approx((FLOOR / 2, 0.5))
    assert found[1] == pytest.approx((1 - FLOOR / 2, 0.5))


def test_a_run_balances_only_with_a_limit_and_two_workers_or_more() -> None:
    from bulkfetch.config import Limits

    assert RateShares.of_run(Limits(workers=2)) is None  # no limit
    assert RateShares.of_run(Limits(workers=1, limit_rate=1000)) is None
    found = RateShares.of_run(Limits(workers=2, max_rps=10))
    assert found is not None and found.bytes is None and found.requests is not None
