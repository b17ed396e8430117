"""How sure a median of a few noisy rounds is: a distribution-free confidence interval.

On a shared VM one row's CPU per file swings by ±20% from round to round, so a bar decided
by the median of five rounds can come out either way on the same code. The interval says
whether the rounds decide it: between two order statistics of the sample, the median of
what the rounds are drawn from lies with a probability that only the binomial law gives
(each round falls below that median with probability one half), whatever the noise's shape.
"""

from __future__ import annotations

from math import comb


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The narrowest interval [x(k), x(n+1-k)] of the sorted values that holds the median
    with at least `confidence`; None when even [min, max] falls short (fewer than six
    rounds for 95%)."""
    ordered = sorted(values)
    n = len(ordered)
    best = None
    for k in range(1, n // 2 + 1):
        # P(the median lies outside) = 2 P(fewer than k of n rounds fall below it)
        outside = 2 * sum(comb(n, i) for i in range(k)) / 2**n
        if 1 - outside < confidence:
            break
        best = (ordered[k - 1], ordered[n - k])
    return best


def verdict(values: list[float], limit: float, at_most: bool,
            confidence: float = 0.95) -> str:
    """Whether the rounds decide 'median <= limit' (or >= when not `at_most`), in words."""
    interval = median_interval(values, confidence)
    if interval is None:
        return f"too few rounds for a {confidence:.0%} interval"
    low, high = interval
    span = f"{confidence:.0%} interval {low:.3f}–{high:.3f}"
    met, missed = (high <= limit, low > limit) if at_most else (low >= limit, high < limit)
    if met:
        return f"{span}: met"
    if missed:
        return f"{span}: missed"
    return f"{span}: not decided by these rounds"
