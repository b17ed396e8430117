"""sources/collisions.py on its own: names two lines give are found however far apart the
lines are, across the partitions' flushes to disk (a small FLUSH_AT stands in for a list of
half a million lines), and only those names are kept, each with its first URL."""

from __future__ import annotations

import pytest

from bulkfetch.sources import collisions
from bulkfetch.sources.collisions import first_urls


def rows_of(lines: list[tuple[str, str]]) -> collisions.Rows:
    return lambda: iter(lines)


@pytest.mark.parametrize(("partitions", "flush_at"), [(1, 4), (3, 2), (64, 8192)])
def test_a_name_given_twice_is_found_across_flushes(monkeypatch: pytest.MonkeyPatch,
                                                    partitions: int, flush_at: int) -> None:
    monkeypatch.setattr(collisions, "PARTITIONS", partitions)
    monkeypatch.setattr(collisions, "FLUSH_AT", flush_at)
    lines = [("dup/first.jpg", "http://a/dup/first.jpg")]
    lines += [(f"n{i}", f"http://a/n{i}") for i in range(40)]  # many flushes in between
    lines += [("dup/first.jpg", "http://b/dup/first.jpg"), ("late", "http://a/late"),
              ("late", "http://a/late")]
    assert first_urls(rows_of(lines)) == {"dup/first.jpg": "http://a/dup/first.jpg",
                                          "late": "http://a/late"}


def test_a_list_of_distinct_names_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collisions, "FLUSH_AT", 2)
    calls = 0

    def rows() -> list[tuple[str, str]]:
        nonlocal calls
        calls += 1
        return [(f"n{i}", f"http://a/n{i}") for i in range(100)]

    assert first_urls(rows) == {}
    assert calls == 1  # no second read when nothing repeats
