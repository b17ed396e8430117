"""The fault plan: deterministic by (seed, target, attempt), rates validated and honoured."""

from __future__ import annotations

import pytest

from bulkfetch.errors import UsageError
from bulkfetch.server.faults import (
    NO_FAULT,
    Fault,
    FaultConfig,
    FaultPlan,
    parse_latency,
)

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


def test_attempt_counter_is_per_target() -> None:
    plan = FaultPlan(MIXED, seed=0)
    assert [plan.attempt("/a") for _ in range(4)] == [0, 1, 2, 3]
    assert plan.attempt("/b") == 0
    assert plan.attempt("/a") == 4
    plan.decide("/c", True)
    plan.decide("/c", True)
    assert plan.attempt("/c") == 2


def test_attempt_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bulkfetch.server.faults._ATTEMPTS_KEPT", 10)
    plan = FaultPlan(MIXED, seed=0)
    for i in range(100):
        plan.attempt(f"/t{i}")
    assert len(plan._attempts) <= 10


def test_inactive_plan_never_faults_nor_counts() -> None:
    plan = FaultPlan(FaultConfig(), seed=0)
    assert not FaultConfig().active
    assert all(plan.decide(t, True) is NO_FAULT for t in TARGETS[:100])
    assert plan._attempts == {}


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
    configured = dict(zip(
        (Fault.STALL, Fault.RESET, Fault.FAIL, Fault.THROTTLE, Fault.TRUNCATE, Fault.CORRUPT),
        config.rates(), strict=True))
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
