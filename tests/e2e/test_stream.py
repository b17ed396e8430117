"""bulkfetch.stream() against the reference server (issue 24): every body byte-exact through
faults, failures raised or returned with their reason, a consumer that stops early or reads
slowly, the one-message-a-body mode giving the same bodies, and bad input refused."""

from __future__ import annotations

import hashlib
import multiprocessing
import subprocess
import sys
import time

import pytest
from getkit import expected_files

import bulkfetch
from bulkfetch import FetchError, UsageError
from bulkfetch.streaming import Stream

FILES = 4000


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    from bulkfetch.testing import ReferenceServer

    with ReferenceServer("--files", str(FILES), "--page-size", "200", "--fail-rate", "0.03",
                         "--reset-rate", "0.01", "--deny-rate", "0.01", "--latency", "0-5",
                         access_log=True) as started:
        yield started


def no_workers_left() -> bool:
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not multiprocessing.active_children()


def test_every_body_byte_exact_or_its_failure(server) -> None:  # type: ignore[no-untyped-def]
    want = expected_files(FILES)
    with bulkfetch.stream(server.url, workers=2, errors="return") as files:
        got = list(files)
    names = [name for name, _ in got]
    assert sorted(names) == sorted(want)  # each name once
    failed = {name: result for name, result in got if isinstance(result, FetchError)}
    for name, body in got:
        if name not in failed:
            assert hashlib.md5(body).hexdigest() == want[name]  # type: ignore[arg-type]
    # --deny-rate 0.01: those names fail every attempt, with the status as the reason
    assert 0 < len(failed) < FILES * 0.03
    assert all("HTTP 4" in error.reason and error.url.endswith(f"/get/{name}")
               for name, error in failed.items())
    assert (files.files, files.failed) == (FILES - len(failed), len(failed))
    assert files.bytes == sum(len(body) for name, body in got if name not in failed)
    assert no_workers_left()


def test_a_failure_raises_by_default(server) -> None:  # type: ignore[no-untyped-def]
    # (only the denied names fail after the retries: the reason is always a 4xx)
    with pytest.raises(FetchError, match="HTTP 4"), \
            bulkfetch.stream(server.url, workers=2) as files:
        for _ in files:
            pass
    assert no_workers_left()


def test_one_message_a_body_gives_the_same_bodies(server) -> None:  # type: ignore[no-untyped-def]
    want = expected_files(FILES)
    with Stream(server.url, workers=2, errors="return", one_by_one=True) as files:
        got = {name: hashlib.md5(body).hexdigest() for name, body in files
               if isinstance(body, bytes)}
    assert got == {name: md5 for name, md5 in want.items() if name in got}
    assert len(got) == files.files > FILES * 0.97


def test_stopping_early_ends_the_workers(server) -> None:  # type: ignore[no-untyped-def]
    files = bulkfetch.stream(server.url, workers=2, errors="return")
    taken = [name for name, _ in zip(range(10), files, strict=False)]
    assert len(taken) == 10
    files.close()
    assert no_workers_left()


def test_a_program_that_stops_early_exits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Pages listed ahead, more than the pipe to the workers holds, when the caller stops:
    the program used to hang at exit, joining the feeder of the pages queue."""
    from bulkfetch.testing import ReferenceServer

    program = tmp_path / "early.py"
    program.write_text(
        "import sys, bulkfetch\n"
        "files = bulkfetch.stream(sys.argv[1], workers=2, concurrency=1)\n"
        "print(len([name for name, _ in zip(range(10), files)]))\n"
        "files.close()\n")
    with ReferenceServer("--files", "40000", "--page-size", "1000") as many:
        done = subprocess.run([sys.executable, str(program), many.url], capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "10\n", done.stderr[-2000:]


def test_a_killed_worker_stops_the_stream_with_a_clear_error(server) -> None:  # type: ignore[no-untyped-def]
    """A worker killed mid-stream (the OOM killer) may have given some of its page's bodies
    already: the stream says so and stops, rather than give any body twice."""
    import os
    import signal

    from bulkfetch.errors import BulkfetchError

    with pytest.raises(BulkfetchError, match=r"worker \d+ lost \(killed by signal 9"), \
            bulkfetch.stream(server.url, workers=2, errors="return") as files:
        for index, _ in enumerate(files):
            if index == 10:
                victims = multiprocessing.active_children()
                assert len(victims) == 2, victims
                os.kill(victims[0].pid, signal.SIGKILL)
    assert no_workers_left()


def test_a_slow_reader_holds_the_workers_back(server) -> None:  # type: ignore[no-untyped-def]
    """With one page out at a time, a reader that sleeps after its first body leaves the
    workers at most a couple of pages ahead: the server sees no more file requests."""
    before = sum(1 for r in server.requests() if "/get/" in r.target)
    with bulkfetch.stream(server.url, workers=1, pages_ahead=1, errors="return") as files:
        next(iter(files))
        time.sleep(1.0)
        asked = sum(1 for r in server.requests() if "/get/" in r.target) - before
    # a page is 200 names; faults add retries. Unbounded, all 4,000 would be asked for.
    assert asked < 3 * 200 * 1.2


def test_a_big_body_arrives_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bulkfetch.testing import ReferenceServer

    with ReferenceServer("--files", "3", "--file-size", "3m") as big, \
            bulkfetch.stream(big.url, workers=1, spool_above=1 << 20) as files:
        got = dict(files)
    assert sorted(len(body) for body in got.values()) == [3 << 20] * 3  # type: ignore[arg-type]


def test_limit_rate_goes_to_the_worker_that_has_the_bytes() -> None:
    """One page of 4 files of 4 MiB: one worker has them all, and held half of
    limit_rate with two workers; the shares move to it as in `get` (rate_shares.py)."""
    from bulkfetch.testing import ReferenceServer

    rate = 4 << 20
    with ReferenceServer("--files", "4", "--file-size", "4m") as big, \
            bulkfetch.stream(big.url, workers=2, limit_rate=rate) as files:
        started = time.monotonic()
        got = dict(files)
        took = time.monotonic() - started
    assert sorted(len(body) for body in got.values()) == [4 << 20] * 4  # type: ignore[arg-type]
    assert 0.75 * rate <= (16 << 20) / took <= 1.1 * rate, (16 << 20) / took / rate


def test_options_a_stream_decides_are_refused(server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match="not take restart, sink: a stream keeps nothing on disk"):
        Stream(server.url, sink="tar", restart=True)


def test_a_listing_that_fails_names_it(server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(bulkfetch.UsageError, match=r"nothing-here/list: HTTP 404"), \
            bulkfetch.stream(f"{server.url}/nothing-here", workers=1, retries=0) as files:
        list(files)
    assert no_workers_left()
