"""The fault plan: deterministic by (seed, target, attempt), rates validated and honoured;
and what the app makes of its decisions."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import time
import zlib
from collections.abc import Callable
from email.utils import parsedate_to_datetime

import pytest

from bulkfetch.errors import UsageError
from bulkfetch.server.app import App, Response, gzip_bomb, render_page, retry_after_value
from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.server.faults import (
    DENY_STATUSES,
    NO_FAULT,
    PER_ATTEMPT,
    REDIRECT_KINDS,
    Attempts,
    Fault,
    FaultConfig,
    FaultPlan,
    LocalAttempts,
    SharedAttempts,
    parse_latency,
    parse_redirect_kinds,
)
from bulkfetch.server.hostile import HugeFirstPage
from bulkfetch.util.sizes import parse_size_spec

MIXED = FaultConfig(stall_rate=0.05, reset_rate=0.05, fail_rate=0.1, throttle_rate=0.1,
                    truncate_rate=0.1, corrupt_rate=0.1, latency_ms=(5.0, 50.0))


def decisions(plan: FaultPlan, targets: list[str], corruptible: bool = True) -> list[tuple]:
    return [
        (d.fault, d.delay_s, d.alternate)
        for d in (plan.decide(target, corruptible) for target in targets)
    ]


TARGETS = [f"/get/f{i:010d}" for i in range(2000)]


def test_same_seed_same_decisions() -> None:
    first = decisions(FaultPlan(MIXED, seed=1), TARGETS)
    again = decisions(FaultPlan(MIXED, seed=1), TARGETS)
    assert first == again
    assert len({fault for fault, _, _ in first}) == 7  # every fault occurs
    other_seed = decisions(FaultPlan(MIXED, seed=2), TARGETS)
    assert sum(a != b for a, b in zip(first, other_seed, strict=True)) > 1000


def test_decision_does_not_depend_on_order_of_other_targets() -> None:
    forward = dict(zip(TARGETS, decisions(FaultPlan(MIXED, 4), TARGETS), strict=True))
    backward_targets = TARGETS[::-1]
    backward = dict(zip(backward_targets, decisions(FaultPlan(MIXED, 4), backward_targets),
                        strict=True))
    assert forward == backward


def test_retries_get_fresh_decisions_that_replay() -> None:
    config = FaultConfig(fail_rate=0.5)
    plan = FaultPlan(config, seed=3)
    target = "/get/f0000000007"
    series = [plan.decide(target, True).fault for _ in range(64)]
    assert {Fault.FAIL, Fault.NONE} == set(series)  # a retry can succeed
    replay = FaultPlan(config, seed=3)
    assert [replay.decide(target, True).fault for _ in range(64)] == series


def small_shared() -> SharedAttempts:
    return SharedAttempts(1 << 16)


@pytest.mark.parametrize("make", [LocalAttempts, small_shared])
def test_attempt_counter_is_per_target(make: Callable[[], Attempts]) -> None:
    attempts = make()
    if isinstance(attempts, SharedAttempts):  # the targets below sit in slots of their own
        assert len({attempts.slot(t) for t in ("/a", "/b", "/c")}) == 3
    plan = FaultPlan(MIXED, seed=0, attempts=attempts)
    assert [attempts.next("/a") for _ in range(4)] == [0, 1, 2, 3]
    assert attempts.next("/b") == 0
    assert attempts.next("/a") == 4
    plan.decide("/c", True)
    plan.decide("/c", True)
    assert attempts.next("/c") == 2


@pytest.mark.parametrize("make", [LocalAttempts, small_shared])
def test_a_plan_decides_the_same_with_either_counter(make: Callable[[], Attempts]) -> None:
    local = FaultPlan(MIXED, seed=5)
    other = FaultPlan(MIXED, seed=5, attempts=make())
    for target in TARGETS[:50] * 3:
        assert local.decide(target, True) == other.decide(target, True)


def test_attempt_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bulkfetch.server.faults._ATTEMPTS_KEPT", 10)
    attempts = LocalAttempts()
    for i in range(100):
        attempts.next(f"/t{i}")
        attempts.mark_looping(f"/t{i}")
    assert len(attempts._counts) <= 10 and len(attempts._looping) <= 10


def test_shared_counts_wrap_and_keep_the_loop_mark() -> None:
    attempts = small_shared()
    attempts.mark_looping("/x")
    assert [attempts.next("/x") for _ in range(130)] == [*range(128), 0, 1]
    assert attempts.looping("/x") and not attempts.looping("/y")


def test_shared_counts_are_seen_by_a_forked_process() -> None:
    """The server's processes are forked after the table is made: one's attempts are the
    next one's."""
    attempts = small_shared()
    attempts.next("/get/a")

    def child() -> None:
        assert attempts.next("/get/a") == 1
        assert attempts.next("/get/a") == 2
        attempts.mark_looping("/get/b")

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(10)
    assert process.exitcode == 0
    assert attempts.next("/get/a") == 3
    assert attempts.looping("/get/b")


def test_shared_slots_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        SharedAttempts(1000)


def test_inactive_plan_never_faults_nor_counts() -> None:
    attempts = LocalAttempts()
    plan = FaultPlan(FaultConfig(), seed=0, attempts=attempts)
    assert not FaultConfig().active
    assert all(plan.decide(t, True) is NO_FAULT for t in TARGETS[:100])
    assert attempts._counts == {}


def test_latency_only_is_active_and_delays_within_bounds() -> None:
    config = FaultConfig(latency_ms=(10.0, 30.0))
    assert config.active
    plan = FaultPlan(config, seed=0)
    delays = [plan.decide(t, True).delay_s for t in TARGETS]
    assert all(0.010 <= d <= 0.030 for d in delays)
    assert min(delays) < 0.011 and max(delays) > 0.029
    assert {plan.decide(t, True).fault for t in TARGETS} == {Fault.NONE}


def test_corrupt_is_not_applied_when_not_corruptible() -> None:
    config = FaultConfig(corrupt_rate=1.0)
    assert {d for d, _, _ in decisions(FaultPlan(config, 0), TARGETS[:200], True)} == {
        Fault.CORRUPT
    }
    assert {d for d, _, _ in decisions(FaultPlan(config, 0), TARGETS[:200], False)} == {
        Fault.NONE
    }
    # other faults still apply to non-corruptible requests (e.g. /list)
    both = FaultConfig(fail_rate=0.5, corrupt_rate=0.5)
    faults = {d for d, _, _ in decisions(FaultPlan(both, 0), TARGETS, False)}
    assert faults == {Fault.FAIL, Fault.NONE}


@pytest.mark.parametrize(
    "config",
    [
        FaultConfig(stall_rate=0.02, reset_rate=0.03, fail_rate=0.15, throttle_rate=0.1,
                    truncate_rate=0.05, corrupt_rate=0.2),
        FaultConfig(fail_rate=0.3),
        FaultConfig(throttle_rate=0.01, corrupt_rate=0.5),
    ],
)
def test_observed_rates_near_configured(config: FaultConfig) -> None:
    plan = FaultPlan(config, seed=42)
    n = 20_000
    counts = dict.fromkeys(Fault, 0)
    alternates = 0
    for i in range(n):
        decision = plan.decide(f"/get/f{i:010d}", True)
        counts[decision.fault] += 1
        alternates += decision.alternate
    configured = dict(zip(PER_ATTEMPT, config.rates(), strict=True))
    configured[Fault.NONE] = 1 - sum(config.rates())
    for fault, rate in configured.items():
        observed = counts[fault] / n
        tolerance = 4 * (rate * (1 - rate) / n) ** 0.5 + 1e-9  # four standard deviations
        assert abs(observed - rate) <= tolerance, (fault, observed, rate)
    assert 0.47 < alternates / n < 0.53


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fail_rate": 0.6, "throttle_rate": 0.5},
        {"stall_rate": 0.2, "reset_rate": 0.2, "fail_rate": 0.2, "throttle_rate": 0.2,
         "truncate_rate": 0.2, "corrupt_rate": 0.01},
        {"fail_rate": 1.5},
        {"corrupt_rate": -0.1},
        {"stall_rate": float("nan")},
        {"retry_after": -1},
    ],
)
def test_bad_rates_raise_usage_error(kwargs: dict) -> None:
    with pytest.raises(UsageError):
        FaultConfig(**kwargs)


def test_rate_message_names_the_flag() -> None:
    with pytest.raises(UsageError, match="--truncate-rate"):
        FaultConfig(truncate_rate=2.0)
    with pytest.raises(UsageError, match="more than 1"):
        FaultConfig(fail_rate=0.7, corrupt_rate=0.31)


@pytest.mark.parametrize(
    "rates",
    [
        {"fail_rate": 1.0},
        {"fail_rate": 0.5, "throttle_rate": 0.5},
        # 0.2 + 0.4 + 0.3 + 0.1 == 1.0000000000000002 in floating point
        {"fail_rate": 0.2, "throttle_rate": 0.4, "truncate_rate": 0.3, "corrupt_rate": 0.1},
        {"reset_rate": 0.1, "fail_rate": 0.2, "throttle_rate": 0.3, "truncate_rate": 0.3,
         "corrupt_rate": 0.1},
    ],
)
def test_rates_adding_up_to_exactly_one_are_accepted(rates: dict) -> None:
    config = FaultConfig(**rates)
    plan = FaultPlan(config, seed=0)
    faults = [plan.decide(t, True).fault for t in TARGETS]
    assert Fault.NONE not in faults


def test_parse_latency() -> None:
    assert parse_latency("50") == (50.0, 50.0)
    assert parse_latency("10-100") == (10.0, 100.0)
    assert parse_latency("0.5-1.5") == (0.5, 1.5)
    for bad in ("", "x", "10-", "100-10", "-5", "1-2-3"):
        with pytest.raises(UsageError):
            parse_latency(bad)


# -- the hostile-server switches: trickle, overlong, redirect, encoding, deny ---------------
NEW = FaultConfig(trickle_rate=0.1, overlong_rate=0.1, redirect_rate=0.1, encoding_rate=0.1,
                  deny_rate=0.2)


def test_new_faults_are_stacked_after_the_old_ones() -> None:
    """Adding a new rate leaves every decision an old configuration made as it was."""
    old = FaultConfig(fail_rate=0.2, truncate_rate=0.1, corrupt_rate=0.1)
    both = FaultConfig(fail_rate=0.2, truncate_rate=0.1, corrupt_rate=0.1, trickle_rate=0.1,
                       overlong_rate=0.1, redirect_rate=0.1, encoding_rate=0.1)
    before = decisions(FaultPlan(old, 5), TARGETS)
    after = decisions(FaultPlan(both, 5), TARGETS)
    for (fault_a, delay_a, alt_a), (fault_b, delay_b, alt_b) in zip(before, after, strict=True):
        assert (delay_a, alt_a) == (delay_b, alt_b)
        if fault_a is not Fault.NONE:
            assert fault_b is fault_a
        else:
            assert fault_b in (Fault.NONE, Fault.TRICKLE, Fault.OVERLONG, Fault.REDIRECT,
                               Fault.ENCODING)
    assert {f for f, _, _ in after} == {Fault.NONE, Fault.FAIL, Fault.TRUNCATE, Fault.CORRUPT,
                                        Fault.TRICKLE, Fault.OVERLONG, Fault.REDIRECT,
                                        Fault.ENCODING}


def test_encoding_and_redirect_only_where_they_apply() -> None:
    encoding = FaultPlan(FaultConfig(encoding_rate=1.0), 0)
    assert {encoding.decide(t, True).fault for t in TARGETS[:100]} == {Fault.ENCODING}
    assert {encoding.decide(t, False).fault for t in TARGETS[:100]} == {Fault.NONE}
    redirect = FaultPlan(FaultConfig(redirect_rate=1.0), 0)
    assert {redirect.decide(t, False).fault for t in TARGETS[:100]} == {Fault.REDIRECT}
    assert {redirect.decide(f"/list?x={i}", False, file=False).fault
            for i in range(100)} == {Fault.NONE}


def test_redirect_kinds_are_deterministic_and_only_those_asked_for() -> None:
    config = FaultConfig(redirect_rate=1.0)
    kinds = [FaultPlan(config, 1).decide(t, True).redirect for t in TARGETS[:400]]
    assert kinds == [FaultPlan(config, 1).decide(t, True).redirect for t in TARGETS[:400]]
    counts = {kind: kinds.count(kind) for kind in REDIRECT_KINDS}
    assert all(60 <= n <= 140 for n in counts.values()), counts  # ~100 each
    some = FaultConfig(redirect_rate=1.0, redirect_to=("file", "relative"))
    assert {FaultPlan(some, 1).decide(t, True).redirect for t in TARGETS[:400]} == {
        "file", "relative"}
    assert {d.redirect for d in (FaultPlan(MIXED, 1).decide(t, True) for t in TARGETS)
            if d.fault is not Fault.REDIRECT} == {""}


def test_a_loop_redirects_its_target_for_ever() -> None:
    plan = FaultPlan(FaultConfig(redirect_rate=0.3, redirect_to=("loop",)), 2)
    looped = [t for t in TARGETS[:200] if plan.decide(t, True).fault is Fault.REDIRECT]
    assert 30 <= len(looped) <= 90
    for target in looped:  # every later attempt at it is the same loop
        assert {plan.decide(target, True).redirect for _ in range(20)} == {"loop"}
    others = [t for t in TARGETS[:200] if t not in looped]
    retried = {plan.decide(t, True).fault for t in others for _ in range(5)}
    assert retried == {Fault.NONE, Fault.REDIRECT}  # per attempt for those never looped


def test_deny_is_per_name_not_per_attempt() -> None:
    plan = FaultPlan(NEW, 9)
    names = [f"f{i:010d}".encode() for i in range(5000)]
    first = [plan.denied(n) for n in names]
    assert first == [plan.denied(n) for n in names]  # a retry gets the same answer
    assert first == [FaultPlan(NEW, 9).denied(n) for n in names]  # so does a new process
    denied = [status for status in first if status is not None]
    assert 0.17 < len(denied) / len(names) < 0.23
    assert set(denied) == set(DENY_STATUSES) == {400, 401, 403, 404, 410}
    assert [FaultPlan(NEW, 10).denied(n) for n in names] != first  # the seed matters
    assert FaultPlan(FaultConfig(deny_rate=1.0), 0).denied(b"x") in DENY_STATUSES
    assert FaultPlan(FaultConfig(fail_rate=0.5), 0).denied(b"x") is None


def test_deny_does_not_count_toward_the_sum_and_is_validated() -> None:
    FaultConfig(fail_rate=0.5, trickle_rate=0.5, deny_rate=1.0)
    assert FaultConfig(deny_rate=0.1).active
    with pytest.raises(UsageError, match="--deny-rate"):
        FaultConfig(deny_rate=1.5)
    with pytest.raises(UsageError, match="more than 1"):
        FaultConfig(overlong_rate=0.6, encoding_rate=0.5)
    with pytest.raises(UsageError, match="--redirect-rate"):
        FaultConfig(redirect_rate=-0.1)
    for interval in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="--trickle-interval"):
            FaultConfig(trickle_interval=interval)
    with pytest.raises(UsageError, match="--redirect-to"):
        FaultConfig(redirect_to=("elsewhere",))


def test_parse_redirect_kinds() -> None:
    assert parse_redirect_kinds("all") == REDIRECT_KINDS
    assert parse_redirect_kinds("relative, file") == ("file", "relative")
    assert parse_redirect_kinds("loop,loop") == ("loop",)
    for bad in ("", ",", "ftp", "file,ftp", "all,file"):
        with pytest.raises(UsageError, match="--redirect-to"):
            parse_redirect_kinds(bad)


# -- what the app makes of those decisions (no sockets) -------------------------------------
def app_get(app: App, target: str, headers: dict[str, str] | None = None,
            method: str = "GET") -> Response:
    return app.handle(method, target, headers or {})


def header(response: Response, key: str) -> str | None:
    return dict(response.headers).get(key)


def data(files: int = 50, size: str = "100") -> SyntheticDataSet:
    return SyntheticDataSet(files, 10, 0, parse_size_spec(size))


def test_every_503_carries_retry_after_in_both_forms() -> None:
    app = App(data(), FaultPlan(FaultConfig(fail_rate=1.0, retry_after=9), 0))
    answers = [app_get(app, f"/get/f{i:010d}") for i in range(50)]
    assert {a.status for a in answers} == {500, 503}
    assert all(header(a, "Retry-After") is None for a in answers if a.status == 500)
    afters = [header(a, "Retry-After") for a in answers if a.status == 503]
    assert "9" in afters and any(a and a.endswith(" GMT") for a in afters)
    assert None not in afters


def test_retry_after_may_be_absurd() -> None:
    assert retry_after_value(10**9, False) == "1000000000"
    when = parsedate_to_datetime(retry_after_value(10**9, True)).timestamp()
    assert abs(when - (time.time() + 10**9)) < 5
    assert retry_after_value(10**30, True) == "Fri, 31 Dec 9999 23:59:59 GMT"
    assert retry_after_value(10**30, False) == str(10**30)


def test_retry_after_zero_as_a_date_is_now_not_the_next_second() -> None:
    # a date ahead would have a polite client hold the whole host at every 503
    for _ in range(3):
        when = parsedate_to_datetime(retry_after_value(0, True)).timestamp()
        assert when <= time.time()
        later = parsedate_to_datetime(retry_after_value(2, True)).timestamp()
        assert time.time() + 1 < later <= time.time() + 3


def test_redirect_locations() -> None:
    def first_location(kinds: tuple[str, ...], target: str,
                       headers: dict[str, str] | None = None) -> Response:
        app = App(data(), FaultPlan(FaultConfig(redirect_rate=1.0, redirect_to=kinds), 0),
                  port=4321)
        return app_get(app, target, headers)

    name = "/get/f0000000003"
    moved = first_location(("other-host",), name)
    assert moved.status == 302 and moved.fault is Fault.REDIRECT
    assert header(moved, "Location") == "http://localhost:4321" + name
    assert first_location(("file",), name).headers[-1] == ("Location", "file:///etc/passwd")
    assert header(first_location(("relative",), name), "Location") == name + "?redirected=1"
    assert header(first_location(("relative",), name + "?a=b"), "Location") == (
        name + "?a=b&redirected=1")
    assert header(first_location(("loop",), name), "Location") == name
    # Arrived through a redirect: served as is, except by a loop.
    for kinds in (("other-host",), ("file",), ("relative",)):
        for target, headers in ((name, {"host": "LOCALHOST:4321"}),
                                (name + "?redirected=1", {"host": "127.0.0.1:4321"})):
            served = first_location(kinds, target, headers)
            assert served.status == 200 and served.fault is Fault.NONE
            assert served.body == data().body(3)
    looped = first_location(("loop",), name + "?redirected=1", {"host": "localhost:4321"})
    assert looped.status == 302 and header(looped, "Location") == name + "?redirected=1"
    # List pages are never redirected.
    app = App(data(), FaultPlan(FaultConfig(redirect_rate=1.0), 0), port=4321)
    assert app_get(app, "/list").status == 200


def test_deny_answers_every_attempt_alike() -> None:
    app = App(data(200), FaultPlan(FaultConfig(deny_rate=0.5, fail_rate=1.0), 4))
    answers = {i: [app_get(app, f"/get/f{i:010d}") for _ in range(3)] for i in range(200)}
    denied = {i: a[0].status for i, a in answers.items() if a[0].fault is Fault.DENY}
    assert set(denied.values()) == {400, 401, 403, 404, 410}
    for i, status in denied.items():
        assert [a.status for a in answers[i]] == [status] * 3
        assert json.loads(answers[i][0].body)["error"]
        assert (header(answers[i][0], "WWW-Authenticate") is not None) == (status == 401)
        assert app_get(app, f"/get/f{i:010d}", method="HEAD").status == status
    others = {a.fault for i, seq in answers.items() if i not in denied for a in seq}
    assert others == {Fault.FAIL}
    assert app_get(app, "/list").status in (500, 503)  # names are denied, not list pages


def test_encoding_sends_a_small_double_gzip_bomb() -> None:
    body, etag = gzip_bomb()
    assert gzip_bomb()[0] is body  # built once
    assert len(body) < 8192
    assert etag == '"' + hashlib.md5(body).hexdigest() + '"'
    inner = zlib.decompress(body, 31)
    assert inner[:2] == b"\x1f\x8b" and len(inner) < 2 << 20
    app = App(data(size="2000"), FaultPlan(FaultConfig(encoding_rate=1.0), 0))
    bomb = app_get(app, "/get/f0000000001", {"range": "bytes=0-9"})
    assert (bomb.status, bomb.body, bomb.fault) == (200, body, Fault.ENCODING)
    assert header(bomb, "Content-Encoding") == "gzip, gzip" and header(bomb, "ETag") == etag
    assert header(bomb, "Content-Range") is None
    assert app_get(app, "/get/f0000000002", method="HEAD").fault is Fault.NONE
    assert app_get(app, "/list").fault is Fault.NONE


def test_body_faults_leave_bodiless_answers_alone() -> None:
    for config in (FaultConfig(trickle_rate=1.0), FaultConfig(overlong_rate=1.0),
                   FaultConfig(truncate_rate=1.0)):
        app = App(data(), FaultPlan(config, 0))
        assert app_get(app, "/get/nope").fault is Fault.NONE
        assert app_get(app, "/get/f0000000001", method="HEAD").fault is Fault.NONE
        assert app_get(app, "/get/f0000000001").fault is not Fault.NONE
        assert app_get(app, "/list").fault is not Fault.NONE  # list pages have bodies too


# -- --huge-page ------------------------------------------------------------------------------
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize(("files", "count"), [(10_000, 9_000), (10_000, 20_000), (5, 1),
                                              (0, 3), (9_000, 4_096)])
def test_huge_first_page_streams_the_bytes_render_page_would(files: int, count: int,
                                                             nested: bool) -> None:
    inner = SyntheticDataSet(files, 7, 1, parse_size_spec("10"), nested)
    huge = HugeFirstPage(inner, count)
    app = App(huge)
    first = app_get(app, "/list")
    assert first.chunks is not None and first.body == b""
    streamed = b"".join(first.chunks)
    assert len(streamed) == first.content_length
    names, following = huge.page(None)
    token = None if following is None else app.tokens.encode(following)
    assert streamed == render_page(names, token)
    assert names == [inner.name(i) for i in range(min(files, count))]
    listed = list(names)
    while token is not None:  # the pages after it: page_size names each, right after
        page = json.loads(app_get(app, f"/list?next-marker={token}").body)
        assert 0 < len(page["FileNames"]) <= 7
        listed += page["FileNames"]
        token = page.get("NextMarker")
    assert listed == [inner.name(i) for i in range(files)]


def test_huge_page_tokens_are_checked() -> None:
    inner = SyntheticDataSet(100, 10, 0, parse_size_spec("10"))
    huge = HugeFirstPage(inner, 15)
    assert huge.page(huge.next_of_first())[0][0] == inner.name(15)
    for start in (0, 14, 16, 100, 2**40):
        with pytest.raises(ValueError):
            huge.page(start.to_bytes(8, "big"))
    plain = App(inner)
    token = plain.tokens.encode(inner.cursor(1))  # a token of the plain data set
    assert App(huge).handle("GET", f"/list?next-marker={token}", {}).status == 400
