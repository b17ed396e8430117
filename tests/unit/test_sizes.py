"""Size specifications: byte suffixes, constant / uniform / lognormal, and bad input."""

from __future__ import annotations

import random
import statistics

import pytest

from bulkfetch.errors import UsageError
from bulkfetch.util.sizes import SizeSpec, parse_bytes, parse_size_spec


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("100", 100),
        (" 100 ", 100),
        ("100b", 100),
        ("4k", 4096),
        ("4K", 4096),
        ("4kb", 4096),
        ("4KiB", 4096),
        ("1.5m", 1536 * 1024),
        ("2g", 2 * 1024**3),
        ("1t", 1024**4),
        ("0.5k", 512),
    ],
)
def test_parse_bytes_suffixes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text", ["", "k", "abc", "1x", "-1", "-4k", "nan", "inf", "1e400", "4 k k"]
)
def test_parse_bytes_refuses_and_names_the_input(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_bytes(text)
    assert repr(text) in str(info.value)


def test_constant_spec() -> None:
    spec = parse_size_spec("64k")
    assert spec.is_constant
    assert spec.size(0.0) == spec.size(0.999) == 65536
    assert spec.describe() == "65536 B"


def test_uniform_spec_covers_both_ends_and_stays_inside() -> None:
    spec = parse_size_spec("uniform:10:20")
    assert not spec.is_constant
    assert spec.size(0.0) == 10
    assert spec.size(0.999999) == 20
    rng = random.Random(1)
    draws = {spec.size(rng.random()) for _ in range(5000)}
    assert draws == set(range(10, 21))


def test_uniform_spec_never_exceeds_max_when_the_unit_rounds_to_one() -> None:
    # The data set draws unit = int.from_bytes(8 bytes) / 2**64, which is 1.0 as a float for
    # the top 1024 values; the size must still be at most MAX.
    unit = (2**64 - 1) / 2**64
    assert unit == 1.0
    assert parse_size_spec("uniform:10:20").size(unit) == 20


def test_uniform_with_suffixes_and_equal_bounds() -> None:
    spec = parse_size_spec("UNIFORM:1k:2k")
    assert (spec.a, spec.maximum) == (1024, 2048)
    assert parse_size_spec("uniform:5:5").size(0.7) == 5


def test_lognormal_median_and_max_over_many_draws() -> None:
    spec = parse_size_spec("lognormal:4k:1.5:64k")
    assert spec.kind == "lognormal"
    rng = random.Random(12345)
    sizes = [spec.size(rng.random()) for _ in range(20_000)]
    assert max(sizes) == 65536  # sigma 1.5 reaches the cap (z > 1.85) many times
    assert min(sizes) >= 0
    median = statistics.median(sizes)
    assert 0.9 * 4096 < median < 1.1 * 4096
    # the cap bites at z = ln(16) / 1.5 = 1.848 -> about 3.2% of draws
    capped = sum(size == 65536 for size in sizes) / len(sizes)
    assert 0.02 < capped < 0.045


def test_lognormal_extreme_units_are_clamped() -> None:
    spec = parse_size_spec("lognormal:100:2:1m")
    assert spec.size(0.0) >= 0
    assert spec.size(1.0) == 1024 * 1024
    assert parse_size_spec("lognormal:100:0:1m").size(0.3) == 100  # sigma 0: always the median


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("uniform:20:10", "uniform:20:10"),
        ("uniform:10", "uniform:10"),
        ("uniform:a:10", "'a'"),
        ("lognormal:100:x:1k", "lognormal:100:x:1k"),
        ("lognormal:0:1:1k", "lognormal:0:1:1k"),
        ("lognormal:100:-1:1k", "lognormal:100:-1:1k"),
        ("lognormal:100:1", "lognormal:100:1"),
        ("normal:1:2", "normal:1:2"),
        ("12q", "12q"),
    ],
)
def test_bad_specs_raise_usage_error_naming_the_input(text: str, fragment: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_size_spec(text)
    assert fragment in str(info.value)


def test_describe() -> None:
    assert parse_size_spec("uniform:1:9").describe() == "uniform 1..9 B"
    assert parse_size_spec("lognormal:100:0.5:1k").describe() == (
        "lognormal median 100 B sigma 0.5 max 1024 B"
    )
    assert SizeSpec("constant", 7).describe() == "7 B"
