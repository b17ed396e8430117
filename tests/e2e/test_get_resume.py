"""Resuming `bulkfetch get`: kill -9 at random moments, Ctrl-C, --restart, --retry-failed, the
lock on DEST, a journal of another source, and `bulkfetch status`. The real CLI runs in a
subprocess against the reference server, whose access log shows what was fetched when."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from getkit import (
    STATE,
    assert_complete,
    command,
    expected_files,
    get,
    read_journal,
    status,
    status_counts,
    stored_files,
)

from bulkfetch.testing import LoggedRequest, ReferenceServer

Start = Callable[..., ReferenceServer]
NAME = re.compile(r"/get/f(\d{10})")


# -- helpers ---------------------------------------------------------------------------------
def done_pages(dest: Path) -> set[int]:
    return {seq for (seq,) in read_journal(dest, "SELECT seq FROM pages WHERE status = 'done'")}


def done_count(dest: Path) -> int:
    """Pages done so far, polled while a run writes the journal (0 until it can be read)."""
    try:
        return len(done_pages(dest))
    except sqlite3.OperationalError:  # created but not yet readable: poll again
        return 0


def listed_count(dest: Path) -> int:
    """Pages listed so far, done or not (0 until the journal can be read)."""
    try:
        return len(read_journal(dest, "SELECT seq FROM pages"))
    except sqlite3.OperationalError:
        return 0


def fetched(server: ReferenceServer, since: float) -> list[LoggedRequest]:
    """The /get/ requests the server logged from `since` on."""
    return [r for r in server.requests() if r.time >= since and r.target.startswith("/get/")]


def wait_for(predicate: Callable[[], bool], proc: subprocess.Popen, what: str,
             timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


# -- 2. kill -9 at random moments ----------------------------------------------------------
def test_kill_9_three_times_then_resume_without_refetching_done_pages(
        reference_server: Start, tmp_path: Path) -> None:
    files, page_size = 20_000, 100
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    server = reference_server("--files", str(files), "--page-size", str(page_size),
                              access_log=True)
    dest = tmp_path / "dest"
    cmd = command(server.url, dest, "--quiet")
    expected = expected_files(files)

    def assert_no_refetch(before: set[int], since: float) -> None:
        again = [r.target for r in fetched(server, since)
                 if int(NAME.fullmatch(r.target).group(1)) // page_size in before]
        assert not again, f"seed {seed}: pages done before the rerun fetched again: {again[:5]}"

    before: set[int] = set()
    for kill in range(3):
        started = time.time()
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            target = len(before) + rng.randint(5, 30)
            wait_for(lambda t=target: done_count(dest) >= t, proc,
                     f"{target} pages done (seed {seed})")
            time.sleep(rng.uniform(0.0, 0.2))
            assert proc.poll() is None, f"seed {seed}: finished before kill {kill + 1}"
        finally:
            kill_group(proc, signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, err)
        time.sleep(0.3)  # let the server log what the killed run had in flight
        assert_no_refetch(before, started)
        before = done_pages(dest)
        assert len(before) < files // page_size, f"seed {seed}: all done before kill {kill + 1}"

    started = time.time()
    final = subprocess.run([*cmd, "--report", str(tmp_path / "final.json")],
                           capture_output=True, text=True, timeout=180)
    assert final.returncode == 0, final.stderr
    assert_no_refetch(before, started)
    report = json.loads((tmp_path / "final.json").read_text())
    assert report["files_ok"] == files and report["files_failed"] == 0
    assert report["resumed_files"] == len(before) * page_size
    assert_complete(dest, expected)
    (pages, done, ok, failed, count), = read_journal(
        dest, "SELECT count(*), sum(status = 'done'), sum(ok), sum(failed), sum(count) "
              "FROM pages")
    assert (pages, done, ok, failed, count) == (files // page_size,) * 2 + (files, 0, files)
    assert read_journal(dest, "SELECT count(*) FROM failures") == [(0,)]
    # every page holds the names of its indices: page p is p*100 ... p*100+99
    assert read_journal(dest, "SELECT count(*) FROM pages WHERE count != 100") == [(0,)]


# -- 6. Ctrl-C, the lock, status -----------------------------------------------------------
def test_interrupt_lock_status_and_resume(reference_server: Start, tmp_path: Path) -> None:
    files, page_size = 5000, 100
    server = reference_server("--files", str(files), "--page-size", str(page_size),
                              "--latency", "10", access_log=True)
    dest = tmp_path / "dest"
    report_path = tmp_path / "first.json"
    cmd = command(server.url, dest, "--concurrency", "4", "--plain")
    proc = subprocess.Popen([*cmd, "--report", str(report_path)], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: done_count(dest) >= 3, proc, "3 pages done")
        # while it runs: status says so, and a second run on the same DEST is refused
        running = status(dest)
        assert running.returncode == 0, running.stderr
        assert f"running (pid {proc.pid})" in running.stdout, running.stdout
        second, second_report = get(server.url, dest, tmp_path / "second.json", "--quiet")
        assert second.returncode == 2, second.stderr
        assert "in use by another bulkfetch run" in second.stderr, second.stderr
        assert str(dest) in second.stderr and f"pid {proc.pid}" in second.stderr
        assert second_report == {}
        assert proc.poll() is None, "the first run ended before it could be interrupted"
        kill_group(proc, signal.SIGINT)  # once: a graceful stop
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Rerun the same command to resume" in err, err
    first = json.loads(report_path.read_text())
    assert first["interrupted"] and first["exit_code"] == 130
    assert 0 < first["files_ok"] < files

    stopped = status(dest)
    assert stopped.returncode == 0, stopped.stderr
    assert "interrupted" in stopped.stdout and "rerun the same command" in stopped.stdout
    ok, failed, listed = status_counts(stopped.stdout)
    assert (ok, failed) == (first["files_ok"], 0) and ok <= listed < files
    done_before = done_pages(dest)
    assert ok == len(done_before) * page_size

    started = time.time()
    proc2, report = get(server.url, dest, tmp_path / "rerun.json", "--concurrency", "4",
                        "--plain")
    assert proc2.returncode == 0, proc2.stderr
    assert report["files_ok"] == files and report["resumed_files"] == ok
    refetched = {r.target for r in fetched(server, started)
                 if int(NAME.fullmatch(r.target).group(1)) // page_size in done_before}
    assert not refetched
    assert_complete(dest, expected_files(files))

    finished = status(dest)
    assert finished.returncode == 0 and f"{dest}: finished" in finished.stdout
    assert status_counts(finished.stdout) == (files, 0, files)


def test_ctrl_c_with_pages_listed_ahead_exits(reference_server: Start, tmp_path: Path) -> None:
    """One file in flight per worker, so the listing runs pages ahead: more than the pipe
    to the workers holds. Ctrl-C stops the workers before they read them; the run used to
    print its summary and then hang at exit, its queue's feeder blocked on the full pipe."""
    server = reference_server("--files", "40000", "--page-size", "1000", "--latency", "5")
    dest = tmp_path / "dest"
    proc = subprocess.Popen(command(server.url, dest, "-w", "2", "--concurrency", "1",
                                    "--plain"),
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: listed_count(dest) >= 12, proc, "12 pages listed")
        kill_group(proc, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Rerun the same command to resume" in err
    rerun, report = get(server.url, dest, tmp_path / "r.json", "-q")
    assert rerun.returncode == 0 and report["files_ok"] == 40000, rerun.stderr
    assert_complete(dest, expected_files(40000))


def test_status_of_a_dest_without_journal(tmp_path: Path) -> None:
    missing = tmp_path / "never-used"
    result = status(missing)
    assert result.returncode == 2
    assert f"{missing} does not exist" in result.stderr, result.stderr
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    result = status(tmp_path / "empty")
    assert result.returncode == 2 and "no bulkfetch journal" in result.stderr


def test_rerun_of_finished_run_fetches_nothing_and_restart_starts_over(
        reference_server: Start, tmp_path: Path) -> None:
    files = 1500
    server = reference_server("--files", str(files), access_log=True)
    dest = tmp_path / "dest"
    expected = expected_files(files)
    proc, report = get(server.url, dest, tmp_path / "r1.json", "--quiet")
    assert proc.returncode == 0 and report["files_ok"] == files, proc.stderr
    assert_complete(dest, expected)

    started = time.time()
    proc, report = get(server.url, dest, tmp_path / "r2.json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == files and report["resumed_files"] == files
    assert fetched(server, started) == []

    (dest / "f0000000007").write_bytes(b"damaged")  # --restart must fetch it again
    started = time.time()
    proc, report = get(server.url, dest, tmp_path / "r3.json", "--quiet", "--restart")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == files and report["resumed_files"] == 0
    targets = [r.target for r in fetched(server, started)]
    assert sorted(targets) == sorted(f"/get/{name}" for name in expected)
    assert_complete(dest, expected)
    assert status_counts(status(dest).stdout) == (files, 0, files)


def test_another_source_on_the_same_dest_is_refused(reference_server: Start,
                                                    tmp_path: Path) -> None:
    first = reference_server("--files", "300")
    other = reference_server("--files", "300")
    assert first.url != other.url
    dest = tmp_path / "dest"
    proc, _ = get(first.url, dest, tmp_path / "r1.json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    journal = (dest / STATE / "journal.sqlite").read_bytes()

    proc, report = get(other.url, dest, tmp_path / "r2.json", "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert str(dest) in proc.stderr and "--restart" in proc.stderr, proc.stderr
    assert "different run" in proc.stderr and other.url in proc.stderr
    assert report == {}
    assert (dest / STATE / "journal.sqlite").read_bytes() == journal
    assert f"source: {first.url}" in status(dest).stdout
    assert_complete(dest, expected_files(300))


# -- 7. --retry-failed ---------------------------------------------------------------------
def test_retry_failed_until_everything_is_done(reference_server: Start, tmp_path: Path) -> None:
    files = 200
    # Faults are a pure function of (seed, target, attempt number), so this run is the same
    # every time: with seed 7 the first run fails 59 files, and one --retry-failed pass meets
    # a failing list page (HTTP 5xx, no retries) on the way to success.
    server = reference_server("--files", str(files), "--fail-rate", "0.3", "--seed", "7",
                              access_log=True)
    dest = tmp_path / "dest"
    expected = expected_files(files, seed=7)
    proc, report = get(server.url, dest, tmp_path / "r0.json", "--quiet", "--retries", "0")
    assert proc.returncode == 1, proc.stderr
    failed = {f["name"] for f in report["failures"]}
    assert failed and report["files_failed"] == len(failed)
    assert report["files_ok"] + len(failed) == files
    assert all(re.fullmatch(r"HTTP 50[03]", f["reason"]) for f in report["failures"])
    assert all(f["attempts"] == 1 for f in report["failures"])
    stored = stored_files(dest)
    assert set(stored) == set(expected) - failed
    assert all(stored[n] == expected[n] for n in stored)

    for attempt in range(1, 6):
        started = time.time()
        proc, report = get(server.url, dest, tmp_path / f"r{attempt}.json", "--plain",
                           "--retries", "0", "--retry-failed")
        # the live count of failures is the report's: a file retried and failed again is
        # not counted once from the journal and once more from this run
        final = re.search(r"final: [\d,]+ files \(([\d,]+) failed", proc.stderr)
        live_failed = int(final.group(1).replace(",", "")) if final else 0
        assert live_failed == report["files_failed"], proc.stderr[-2000:]
        # only the files that had failed are asked for again
        asked = {r.target.removeprefix("/get/") for r in fetched(server, started)}
        assert asked <= failed, sorted(asked - failed)[:5]
        now_failed = {f["name"] for f in report["failures"]}
        assert now_failed <= failed
        assert report["files_ok"] + report["files_failed"] == files
        failed = now_failed
        if proc.returncode == 0:
            break
        assert proc.returncode == 1, proc.stderr
    assert proc.returncode == 0, f"still {len(failed)} failed after 5 --retry-failed runs"
    assert report["files_ok"] == files and report["failures"] == []
    assert_complete(dest, expected)
    result = status(dest)
    assert result.returncode == 0 and f"{dest}: finished" in result.stdout, result.stdout
    assert status_counts(result.stdout) == (files, 0, files)


def test_retry_failed_after_an_interrupt_resumes_everything(reference_server: Start,
                                                           tmp_path: Path) -> None:
    """--retry-failed on an interrupted run must not journal the listing as complete."""
    files, page_size = 5000, 100
    server = reference_server("--files", str(files), "--page-size", str(page_size),
                              "--latency", "10")
    dest = tmp_path / "dest"
    proc = subprocess.Popen(command(server.url, dest, "--quiet", "--concurrency", "4"),
                            start_new_session=True, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: done_count(dest) >= 3, proc, "3 pages done")
        kill_group(proc, signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        kill_group(proc, signal.SIGKILL)
    assert proc.returncode == 130
    assert read_journal(dest, "SELECT listing_done FROM run") == [(0,)]

    proc2, report = get(server.url, dest, tmp_path / "r.json", "--quiet", "--retry-failed")
    assert proc2.returncode == 0, proc2.stderr
    assert report["files_ok"] == files and report["listing_complete"]
    assert_complete(dest, expected_files(files))
    assert status_counts(status(dest).stdout) == (files, 0, files)
