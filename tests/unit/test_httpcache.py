"""httpcache.py and freshness.py: what is kept and for how long (Cache-Control, Expires,
validators, the ttl override), LRU eviction by bytes, a reopened directory, and two
processes writing and reading one directory at once without a wrong body or a torn index."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sqlite3
from pathlib import Path

import pytest

from bulkfetch.client.freshness import freshness, response_headers
from bulkfetch.client.httpcache import Entry, HttpCache
from bulkfetch.errors import UsageError

ETAG = {"etag": '"abc"'}


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def open_cache(path: Path, clock: Clock, **options: object) -> HttpCache:
    return HttpCache(path, clock=clock, **options)  # type: ignore[arg-type]


# -- freshness.py ----------------------------------------------------------------------
def test_response_headers_reads_the_final_response_of_a_redirect() -> None:
    lines = [b"HTTP/1.1 301 Moved\r\n", b"Location: /b\r\n", b"Cache-Control: no-store\r\n",
             b"\r\n", b"HTTP/1.1 200 OK\r\n", b"ETag: \"x\"\r\n",
             b"Cache-Control: max-age=5\r\n", b"cache-control: must-revalidate\r\n", b"\r\n"]
    assert response_headers(lines) == {"etag": '"x"',
                                       "cache-control": "max-age=5, must-revalidate"}


@pytest.mark.parametrize(("headers", "ttl", "store", "lifetime", "no_cache"), [
    ({"cache-control": "max-age=60"}, None, True, 60, False),
    ({"cache-control": "max-age=60", "age": "15"}, None, True, 45, False),
    ({"cache-control": "s-maxage=600, max-age=60"}, None, True, 60, False),
    ({"cache-control": "max-age=60"}, 999, True, 60, False),  # the server's, not the ttl
    ({"cache-control": "no-store, max-age=60"}, 999, False, 0, False),
    ({"cache-control": "no-cache", **ETAG}, 999, True, 0, True),
    ({"cache-control": "max-age=0", **ETAG}, 999, True, 0, False),
    ({"expires": "Thu, 01 Jan 2026 00:01:40 GMT", "date": "Thu, 01 Jan 2026 00:00:00 GMT"},
     None, True, 100, False),
    ({"expires": "0", **ETAG}, 999, True, 0, False),  # an unreadable Expires is the past
    (ETAG, 30, True, 30, False),  # no freshness stated: the ttl
    (ETAG, None, True, 0, False),  # ... and without one: stale at once, kept to revalidate
    ({}, None, False, 0, False),  # never fresh, nothing to revalidate with: useless
    ({}, 30, True, 30, False),
    ({"vary": "*", "cache-control": "max-age=60"}, None, False, 0, False),
])
def test_freshness_rules(headers: dict[str, str], ttl: float | None, store: bool,
                         lifetime: float, no_cache: bool) -> None:
    rule = freshness(headers, 1_700_000_000.0, ttl)
    assert (rule.store, rule.lifetime, rule.no_cache) == (store, lifetime, no_cache)


def test_a_validator_that_could_inject_a_header_is_not_kept() -> None:
    rule = freshness({"etag": '"a"\r\nX-Evil: 1', "last-modified": "Mon"}, 0.0, None)
    assert (rule.etag, rule.last_modified) == ("", "Mon")
    assert Entry("u", "f", 0, "", 0, 0, '"a"', "Mon", "", False).conditional_headers() == (
        'If-None-Match: "a"', "If-Modified-Since: Mon")


# -- the store -------------------------------------------------------------------------
def test_a_fresh_entry_is_a_hit_until_it_is_stale(tmp_path: Path, clock: Clock) -> None:
    with open_cache(tmp_path, clock) as cache:
        assert cache.lookup("u") is None
        assert cache.store("u", b"body", {"cache-control": "max-age=10", **ETAG})
        assert cache.lookup("u") == b"body"
        clock.now += 10
        stale = cache.lookup("u")
        assert isinstance(stale, Entry) and stale.etag == '"abc"'
        assert stale.conditional_headers() == ('If-None-Match: "abc"',)
        assert (cache.hits, cache.stale, cache.misses, cache.stored) == (1, 1, 1, 1)


def test_no_store_is_not_kept_and_no_cache_is_always_revalidated(tmp_path: Path,
                                                                 clock: Clock) -> None:
    with open_cache(tmp_path, clock, ttl=100) as cache:
        assert not cache.store("a", b"x", {"cache-control": "no-store", **ETAG})
        assert cache.lookup("a") is None
        assert cache.store("b", b"y", {"cache-control": "no-cache", **ETAG})
        assert isinstance(cache.lookup("b"), Entry)  # kept, but never fresh
        assert cache.totals() == (1, 1)


def test_ttl_applies_only_without_freshness_of_the_servers(tmp_path: Path,
                                                           clock: Clock) -> None:
    with open_cache(tmp_path, clock, ttl=50) as cache:
        cache.store("plain", b"p", ETAG)
        cache.store("short", b"s", {"cache-control": "max-age=5", **ETAG})
        clock.now += 20
        assert cache.lookup("plain") == b"p"
        assert isinstance(cache.lookup("short"), Entry)
        clock.now += 31
        assert isinstance(cache.lookup("plain"), Entry)


def test_a_304_renews_the_entry_and_keeps_what_it_does_not_state(tmp_path: Path,
                                                                 clock: Clock) -> None:
    with open_cache(tmp_path, clock) as cache:
        cache.store("u", b"body", {"cache-control": "max-age=10", **ETAG,
                                   "last-modified": "Mon, 01 Jan 2024 00:00:00 GMT"})
        clock.now += 11
        entry = cache.lookup("u")
        assert isinstance(entry, Entry)
        assert cache.refresh(entry, {"etag": '"abc"'}) == b"body"  # Cache-Control stays
        assert cache.lookup("u") == b"body"
        clock.now += 11
        entry = cache.lookup("u")
        assert isinstance(entry, Entry)
        assert entry.last_modified == "Mon, 01 Jan 2024 00:00:00 GMT"
        assert cache.revalidated == 1


def test_a_304_for_an_entry_replaced_meanwhile_is_refused(tmp_path: Path,
                                                          clock: Clock) -> None:
    with open_cache(tmp_path, clock) as cache:
        cache.store("u", b"old", ETAG)
        entry = cache.lookup("u")
        assert isinstance(entry, Entry)
        cache.store("u", b"new", {"etag": '"new"'})  # another process's store, say
        assert cache.refresh(entry, ETAG) is None  # so the old body is never served
        assert isinstance(cache.lookup("u"), Entry)
        assert not (tmp_path / "data" / entry.file).exists()  # the replaced file went


def test_a_missing_or_short_file_is_a_miss(tmp_path: Path, clock: Clock) -> None:
    with open_cache(tmp_path, clock, ttl=100) as cache:
        cache.store("a", b"aaaa", {})
        cache.store("b", b"bbbb", {})
        rows = dict(cache.db.execute("SELECT url, file FROM entries"))
        os.unlink(tmp_path / "data" / rows["a"])
        (tmp_path / "data" / rows["b"]).write_bytes(b"bb")  # torn (a power cut, say)
        assert cache.lookup("a") is None and cache.lookup("b") is None


def test_least_recently_used_bytes_are_evicted(tmp_path: Path, clock: Clock) -> None:
    with open_cache(tmp_path, clock, max_bytes=300, ttl=1000) as cache:
        for key in "abc":
            cache.store(key, key.encode() * 100, {})
            clock.now += 1
        assert cache.lookup("a") is not None  # a used: b is now the oldest
        clock.now += 1
        cache.store("d", b"d" * 100, {})
        assert cache.lookup("b") is None
        assert all(cache.lookup(key) is not None for key in "acd")
        assert cache.totals() == (3, 300) and cache.evicted == 1
        assert not cache.store("huge", b"h" * 301, {})  # larger than the whole bound
        files = [path for path in (tmp_path / "data").rglob("*") if path.is_file()]
        assert len(files) == 3  # the evicted body's file went with its row


def test_a_reopened_directory_has_its_entries(tmp_path: Path, clock: Clock) -> None:
    with open_cache(tmp_path, clock, ttl=100) as cache:
        cache.store("u", b"body", ETAG)
    with open_cache(tmp_path, clock, ttl=100) as cache:
        assert cache.lookup("u") == b"body" and cache.totals() == (1, 4)


def test_sweep_removes_what_a_crash_left(tmp_path: Path, clock: Clock) -> None:
    with open_cache(tmp_path, clock, ttl=100) as cache:
        cache.store("u", b"body", {})
        (tmp_path / "data" / "ab").mkdir(exist_ok=True)
        (tmp_path / "data" / "ab" / ".123-dead").write_bytes(b"half")
        (tmp_path / "data" / "ab" / "orphan-1").write_bytes(b"x")
        assert cache.sweep(grace_s=3600) == 0  # young: maybe another process's write
        assert cache.sweep(grace_s=-1) == 2
        assert cache.lookup("u") == b"body"


def test_an_unusable_directory_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="unusable"):
        HttpCache(tmp_path / "file")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "index.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(UsageError, match="unusable"):
        HttpCache(tmp_path / "other")
    with pytest.raises(UsageError):
        HttpCache(tmp_path / "x", max_bytes=0)


# -- two processes ---------------------------------------------------------------------
KEYS = 24  # few keys: the two processes keep meeting on the same ones
ROUNDS = 3000


def body_of(key: int, version: int) -> bytes:
    # the URL and the version are in the body: a wrong URL's body or a torn one shows
    return f"{key}:{version}:".encode() * (1 + (key * 7 + version * 13) % 400)


def worker(directory: str, seed: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import random

    rng = random.Random(seed)
    wrong = hits = 0
    # small bound: evictions run all the time, under the other process's reads
    with HttpCache(directory, max_bytes=20_000, ttl=1000) as cache:
        for _ in range(ROUNDS):
            key = rng.randrange(KEYS)
            if rng.random() < 0.5:
                cache.store(f"u{key}", body_of(key, rng.randrange(5)), {})
                continue
            found = cache.lookup(f"u{key}")
            if isinstance(found, bytes):
                hits += 1
                if not any(found == body_of(key, version) for version in range(5)):
                    wrong += 1
    out.put((wrong, hits))


def test_two_processes_share_a_directory(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    HttpCache(tmp_path).close()  # (either may also make it: tested by the race below)
    processes = [context.Process(target=worker, args=(str(tmp_path), seed, out))
                 for seed in (1, 2)]
    for process in processes:
        process.start()
    results = [out.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert all(wrong == 0 for wrong, _ in results)
    assert sum(hits for _, hits in results) > 100  # the reads did find bodies
    # the index agrees with itself and with the files
    db = sqlite3.connect(tmp_path / "index.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = db.execute("SELECT url, file, size, md5 FROM entries").fetchall()
    assert db.execute("SELECT count, bytes FROM totals").fetchone() == (
        len(rows), sum(row[2] for row in rows))
    assert sum(row[2] for row in rows) <= 20_000
    named = set()
    for url, file, size, md5 in rows:
        body = (tmp_path / "data" / file).read_bytes()
        assert len(body) == size and hashlib.md5(body).hexdigest() == md5
        assert body.startswith(f"{url[1:]}:".encode())
        named.add(file)
    on_disk = {f"{path.parent.name}/{path.name}" for path in (tmp_path / "data").rglob("*")
               if path.is_file()}
    assert on_disk == named  # nothing leaked (temporaries included), nothing missing


def test_two_processes_opening_a_new_directory_at_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    out = context.Queue()

    def opener(index: int) -> None:
        with HttpCache(tmp_path / "new", ttl=10) as cache:
            cache.store(f"u{index}", b"x", {})
        out.put(index)

    processes = [context.Process(target=opener, args=(index,)) for index in range(4)]
    for process in processes:
        process.start()
    assert sorted(out.get(timeout=60) for _ in processes) == [0, 1, 2, 3]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    with HttpCache(tmp_path / "new", ttl=10) as cache:
        assert cache.totals() == (4, 4)
