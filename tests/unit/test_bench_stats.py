"""The interval benchmarks/get.py prints beside each paired bar."""

from __future__ import annotations

import random
import statistics
from math import comb

import pytest

from bulkfetch.bench.stats import median_interval, verdict


def coverage(n: int, k: int) -> float:
    return 1 - 2 * sum(comb(n, i) for i in range(k)) / 2**n


@pytest.mark.parametrize(("n", "k"), [(6, 1), (8, 1), (9, 2), (12, 3), (15, 4), (20, 6),
                                      (25, 8)])
def test_interval_is_the_narrowest_pair_of_order_statistics_with_95_percent(n: int,
                                                                          k: int) -> None:
    values = [float(v) for v in random.Random(n).sample(range(1000), n)]
    ordered = sorted(values)
    assert median_interval(values) == (ordered[k - 1], ordered[n - k])
    assert coverage(n, k) >= 0.95 > coverage(n, k + 1)


@pytest.mark.parametrize("n", [0, 1, 3, 5])
def test_too_few_rounds_give_no_interval(n: int) -> None:
    assert median_interval([1.0] * n) is None
    assert verdict([1.0] * n, 1.15, at_most=True) == "too few rounds for a 95% interval"


def test_interval_holds_the_true_median_about_as_often_as_it_says() -> None:
    # Skewed noise, like CPU time on a busy machine: the true median of 1 + lognormal(0, 0.2)
    # is 2. The interval for 9 rounds covers 96.1% in theory.
    rng = random.Random(7)
    trials, held = 4000, 0
    for _ in range(trials):
        interval = median_interval([1 + rng.lognormvariate(0, 0.2) for _ in range(9)])
        assert interval is not None
        held += interval[0] <= 2.0 <= interval[1]
    assert 0.945 <= held / trials <= 0.975


def test_verdict_names_the_side_the_rounds_decide() -> None:
    low = [1.01, 1.02, 1.04, 1.05, 1.06, 1.08, 1.09, 1.10, 1.12]  # interval 1.02-1.10
    assert verdict(low, 1.15, at_most=True) == "95% interval 1.020–1.100: met"
    assert verdict(low, 1.0, at_most=True) == "95% interval 1.020–1.100: missed"
    assert verdict(low, 1.05, at_most=True).endswith("not decided by these rounds")
    assert verdict(low, 1.0, at_most=False).endswith(": met")
    assert verdict(low, 1.2, at_most=False).endswith(": missed")
    assert statistics.median(low) == 1.06
