"""memcache.py: bodies kept by URL, bounded by bytes, each for a time to live."""

from __future__ import annotations

import pytest

from bulkfetch.client.memcache import MemoryCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_body_is_kept_for_its_time_to_live() -> None:
    clock = Clock()
    cache = MemoryCache(1000, ttl=10, clock=clock)
    assert cache.get("u") is None
    cache.put("u", b"body")
    clock.now += 9.9
    assert cache.get("u") == b"body"
    clock.now += 0.2
    assert cache.get("u") is None and cache.bytes == 0 and len(cache) == 0
    assert (cache.hits, cache.misses) == (1, 2)


def test_the_least_recently_used_go_first_when_the_bytes_are_over() -> None:
    cache = MemoryCache(10, clock=Clock())
    cache.put("a", b"aaaa")
    cache.put("b", b"bbbb")
    assert cache.get("a") == b"aaaa"  # a is now the more recent
    cache.put("c", b"cccc")  # 12 bytes: b goes
    assert cache.get("b") is None and cache.get("a") == b"aaaa" and cache.get("c") == b"cccc"
    assert cache.bytes == 8
    cache.put("a", b"a")  # replacing counts the new size only
    assert cache.bytes == 5
    cache.put("huge", b"x" * 11)  # larger than the whole bound: not kept, nothing dropped
    assert cache.get("huge") is None and len(cache) == 2


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="cache_bytes"):
        MemoryCache(0)
    with pytest.raises(ValueError, match="cache_ttl"):
        MemoryCache(10, ttl=0)
