"""Client(cache_dir=...) against the reference server (issue 24): after the ttl every URL is
revalidated and the server answers 304 with no body (its access log says so), a new Client
on the same directory (a restart) asks for nothing, a changed file (--etag-salt) is fetched
again, two processes sharing the directory each get every body right, the memory cache
stands in front of the disk, and bodies that take the fetcher's spool path are kept too."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest
from getkit import dataset

from bulkfetch import Client
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.ports import free_port

FILES = 300
TTL = 1.0


def bodies(*args: str) -> dict[str, str]:
    """name -> MD5 of its body as the server with `args` serves it."""
    with ReferenceServer("--files", str(FILES), *args) as server, Client() as client:
        return {url.rsplit("/", 1)[1]: hashlib.md5(body).hexdigest()  # type: ignore[arg-type]
                for url, body in client.get_many(
                    f"{server.url}/get/{name}" for name in names())}


def names() -> list[str]:
    ds = dataset(FILES)
    return [ds.name(i) for i in range(FILES)]


def log_since(server: ReferenceServer, before: int) -> Counter[tuple[int, int]]:
    """(status, body length) of the requests logged after the first `before`."""
    time.sleep(0.2)  # the log is written as each answer ends
    return Counter((r.status, r.length) for r in server.requests()[before:])


def fetch_all(client: Client, urls: list[str]) -> dict[str, str]:
    return {url: hashlib.md5(body).hexdigest()  # type: ignore[arg-type]
            for url, body in client.get_many(urls)}


def test_stale_entries_are_revalidated_with_no_body_and_survive_a_restart(
        tmp_path: Path) -> None:
    want = bodies_by_name()
    with ReferenceServer("--files", str(FILES), access_log=True) as server:
        urls = [f"{server.url}/get/{name}" for name in names()]
        expected = {url: want[url.rsplit("/", 1)[1]] for url in urls}
        with Client(cache_dir=tmp_path, cache_dir_ttl=TTL) as client:
            assert fetch_all(client, urls) == expected  # misses: 200s, stored
            assert fetch_all(client, urls) == expected  # fresh: no request at all
            stats = client.cache_stats()
            assert (stats["disk_stored"], stats["disk_hits"], stats["requested"]) == (
                FILES, FILES, FILES)
            assert log_since(server, 0) == {(200, 100): FILES}
            time.sleep(TTL + 0.1)
            before = len(server.requests())
            assert fetch_all(client, urls) == expected  # stale: If-None-Match -> 304
            assert log_since(server, before) == {(304, 0): FILES}  # no body transferred
            stats = client.cache_stats()
            assert (stats["disk_stale"], stats["disk_revalidated"]) == (FILES, FILES)
        # a restart: a new Client on the same directory, within the renewed ttl
        before = len(server.requests())
        with Client(cache_dir=tmp_path, cache_dir_ttl=TTL) as client:
            assert fetch_all(client, urls) == expected
            assert client.cache_stats()["disk_hits"] == FILES
            assert client.requested == 0
        assert log_since(server, before) == {}


def test_a_changed_file_is_fetched_again(tmp_path: Path) -> None:
    old, new = bodies(), bodies("--etag-salt", "v2")
    assert all(old[name] != new[name] for name in old)
    port = free_port()  # the same URLs from both servers: the same cache keys
    with ReferenceServer("--files", str(FILES), "--port", str(port)) as server:
        urls = [f"{server.url}/get/{name}" for name in names()]
        with Client(cache_dir=tmp_path, cache_dir_ttl=TTL) as client:
            assert fetch_all(client, urls) == {url: old[url.rsplit("/", 1)[1]]
                                               for url in urls}
    time.sleep(TTL + 0.1)
    with ReferenceServer("--files", str(FILES), "--port", str(port), "--etag-salt", "v2",
                         access_log=True) as server:
        with Client(cache_dir=tmp_path, cache_dir_ttl=TTL) as client:
            assert fetch_all(client, urls) == {url: new[url.rsplit("/", 1)[1]]
                                               for url in urls}
            stats = client.cache_stats()
            assert (stats["disk_stale"], stats["disk_revalidated"], stats["disk_stored"]) == (
                FILES, 0, FILES)
            assert fetch_all(client, urls) == {url: new[url.rsplit("/", 1)[1]]
                                               for url in urls}  # the new ones were kept
        assert log_since(server, 0) == {(200, 100): FILES}


def shared_reader(directory: str, base: str, rounds: int,
                  out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    want = bodies_by_name()
    wrong = 0
    urls = [f"{base}/get/{name}" for name in names()]
    # In a new order each round: read in one order again and again, an LRU bound below the
    # whole set evicts each entry just before it is wanted (no hit, no 304, ever).
    order = random.Random(os.getpid())
    try:
        with Client(cache_dir=directory, cache_dir_ttl=0.05,
                    cache_dir_bytes=25_000) as client:
            for _ in range(rounds):
                order.shuffle(urls)
                for url, body in client.get_many(urls):
                    wrong += hashlib.md5(body).hexdigest() != want[url.rsplit("/", 1)[1]]  # type: ignore[arg-type]
                time.sleep(0.02)
            stats = client.cache_stats()
    except Exception as exc:  # the parent reports it (not a queue waited on in vain)
        out.put((repr(exc), {}))
        raise
    out.put((wrong, stats))


def bodies_by_name() -> dict[str, str]:
    ds = dataset(FILES)
    return {ds.name(i): hashlib.md5(ds.body(i)).hexdigest() for i in range(FILES)}


def test_two_processes_share_the_directory(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")  # a Client's threads do not fork
    out = context.Queue()
    with ReferenceServer("--files", str(FILES), access_log=True) as server:
        workers = [context.Process(target=shared_reader,
                                   args=(str(tmp_path), server.url, 6, out))
                   for _ in range(2)]
        for worker in workers:
            worker.start()
        results = [out.get(timeout=120) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
            assert worker.exitcode == 0
        statuses = log_since(server, 0)
    assert [wrong for wrong, _ in results] == [0, 0]
    # a small bound (25 kB of 30 kB of bodies) and a short ttl: evictions, stores,
    # hits and 304s all happened, in both processes at once
    totals = Counter[str]()
    for _, stats in results:
        totals.update(stats)
    assert totals["disk_hits"] and totals["disk_revalidated"] and totals["disk_evicted"]
    # every 304 renewed an entry, or found it evicted meanwhile and asked again; a loaded
    # machine may see a hedged or redialled request (engine/second_tries.py) ask once more,
    # its losing answer dropped (CI: 1,198 304s for 726 + 471)
    extra = statuses[(304, 0)] - totals["disk_revalidated"] - totals["disk_asked_again"]
    assert 0 <= extra <= 3, (statuses, totals)
    assert set(statuses) == {(200, 100), (304, 0)}
    db = sqlite3.connect(tmp_path / "index.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = db.execute("SELECT file, size FROM entries").fetchall()
    assert db.execute("SELECT bytes FROM totals").fetchone()[0] == sum(s for _, s in rows)
    assert sum(size for _, size in rows) <= 25_000
    assert all((tmp_path / "data" / file).stat().st_size == size for file, size in rows)


def test_memory_first_then_disk(tmp_path: Path) -> None:
    with ReferenceServer("--files", str(FILES)) as server:
        urls = [f"{server.url}/get/{name}" for name in names()[:50]]
        with Client(cache_dir=tmp_path, cache_dir_ttl=60) as client:
            first = dict(client.get_many(urls))
        with Client(cache_bytes=1 << 20, cache_dir=tmp_path, cache_dir_ttl=60) as client:
            assert dict(client.get_many(urls)) == first  # from the disk, into memory
            assert dict(client.get_many(urls)) == first  # from memory
            stats = client.cache_stats()
        assert (stats["disk_hits"], stats["memory_hits"], stats["requested"]) == (50, 50, 0)


def test_an_unusable_cache_dir_is_refused(tmp_path: Path) -> None:
    from bulkfetch.errors import UsageError

    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError):
        Client(cache_dir=tmp_path / "file")


def test_bodies_above_the_in_memory_limit_are_kept_and_revalidated(tmp_path: Path) -> None:
    # spool_above below the 100-byte files: every 200 stops at MAXFILESIZE and is fetched
    # again as a stream (big.py), whose headers the cache keeps all the same; a 304 has no
    # body and never leaves the in-memory path
    want = bodies_by_name()
    with ReferenceServer("--files", str(FILES), access_log=True) as server:
        urls = [f"{server.url}/get/{name}" for name in names()[:100]]
        expected = {url: want[url.rsplit("/", 1)[1]] for url in urls}
        with Client(cache_dir=tmp_path, cache_dir_ttl=TTL, spool_above=50) as client:
            assert fetch_all(client, urls) == expected
            assert client.cache_stats()["disk_stored"] == 100
            time.sleep(TTL + 0.1)
            before = len(server.requests())
            assert fetch_all(client, urls) == expected
            assert client.cache_stats()["disk_revalidated"] == 100
            assert log_since(server, before) == {(304, 0): 100}
