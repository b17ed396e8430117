"""The SQLite journal: fingerprint, lock, resume, token loops, failures, status, crashes."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bulkfetch.cli.status import render_status
from bulkfetch.dest.journal import Journal
from bulkfetch.dest.journal_reader import read_status
from bulkfetch.errors import (
    BulkfetchError,
    DestBusy,
    DestNotWritable,
    JournalCorrupt,
    JournalMismatch,
    NoJournal,
    TokenLoop,
    UsageError,
)
from bulkfetch.models import Failure, PageReport

FP = {"source": "http://127.0.0.1:8000", "from_file": False,
      "shape": {"names_key": "FileNames", "next_key": "NextMarker"},
      "sink": {"kind": "dir", "fanout": 0}}


def db_path(dest: Path) -> Path:
    return dest / ".bulkfetch" / "journal.sqlite"


def tok(seq: int) -> str | None:
    return None if seq == 0 else f"t{seq}"


def add_pages(j: Journal, seqs: range, count: int = 10) -> None:
    for seq in seqs:
        j.add_page(seq, tok(seq), f"t{seq + 1}", count)


def start_child(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", line
    return proc


HOLDER = """
import sys
from pathlib import Path
from bulkfetch.dest.journal import Journal
from bulkfetch.models import PageReport
j = Journal.open(Path(sys.argv[1]), {"source": "s"})
j.add_page(0, None, None, 3)
print("ready", flush=True)
sys.stdin.readline()
j.page_done(PageReport(0, 3, 30))
j.close()
"""


# ---------------------------------------------------------------------------- fingerprint


def test_fingerprint_stored_on_first_use_and_dirs_created(tmp_path: Path) -> None:
    dest = tmp_path / "a" / "b"
    with Journal.open(dest, FP) as j:
        assert not j.resumed
        assert db_path(dest).is_file() and (dest / ".bulkfetch" / "lock").is_file()
    conn = sqlite3.connect(db_path(dest))
    (stored,) = conn.execute("SELECT fingerprint FROM run").fetchone()
    assert stored == json.dumps(FP, sort_keys=True)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()
    with Journal.open(dest, dict(reversed(FP.items()))) as j:  # key order does not matter
        assert not j.resumed  # nothing had been listed


def test_password_in_source_url_is_not_stored(tmp_path: Path) -> None:
    with Journal.open(tmp_path, {"source": "https://bob:s3cret@host/x"}):
        pass
    assert b"s3cret" not in db_path(tmp_path).read_bytes()
    assert read_status(tmp_path).fingerprint == {"source": "https://bob:***@host/x"}
    with Journal.open(tmp_path, {"source": "https://bob:other@host/x"}):  # same run
        pass


def test_fingerprint_mismatch_names_dest_and_differences(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(2))
    other = {**FP, "source": "http://elsewhere", "sink": {"kind": "dir", "fanout": 2}}
    with pytest.raises(JournalMismatch) as info:
        Journal.open(tmp_path, other)
    msg = str(info.value)
    assert str(tmp_path) in msg
    assert 'source: "http://127.0.0.1:8000" vs "http://elsewhere"' in msg
    assert "sink.fanout: 0 vs 2" in msg
    assert "sink.kind" not in msg and "shape" not in msg  # only what differs
    assert "--restart" in msg and "another DEST" in msg
    assert info.value.differences == ('sink.fanout: 0 vs 2',
                                      'source: "http://127.0.0.1:8000" vs "http://elsewhere"')
    assert isinstance(info.value, UsageError)
    # the refused open released the lock and changed nothing
    with Journal.open(tmp_path, FP) as j:
        assert j.resumed and j.totals().pages_listed == 2


def test_restart_starts_fresh_and_keeps_files(tmp_path: Path) -> None:
    (tmp_path / "downloaded").write_bytes(b"x")
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(3))
        j.page_done(PageReport(0, 9, 90, (Failure("f", "404", 1),)))
    other = {**FP, "source": "http://elsewhere"}
    with Journal.open(tmp_path, other, restart=True) as j:
        assert not j.resumed
        assert j.totals().pages_listed == 0 and j.failure_count() == 0
        assert j.pending_pages() == [] and j.resume_point() == (0, None, False)
    assert (tmp_path / "downloaded").read_bytes() == b"x"
    assert read_status(tmp_path).fingerprint["source"] == "http://elsewhere"
    with Journal.open(tmp_path, other):  # the new fingerprint is the one stored now
        pass


# ---------------------------------------------------------------------------- lock


def test_second_open_in_same_process_is_refused(tmp_path: Path) -> None:
    j = Journal.open(tmp_path, FP)
    with pytest.raises(DestBusy) as info:
        Journal.open(tmp_path, FP)
    assert str(tmp_path) in str(info.value) and f"pid {os.getpid()}" in str(info.value)
    assert info.value.pid == os.getpid()
    j.close()
    j.close()  # idempotent
    Journal.open(tmp_path, FP).close()


def test_open_while_a_subprocess_holds_the_lock_is_refused(tmp_path: Path) -> None:
    proc = start_child(HOLDER, str(tmp_path))
    try:
        with pytest.raises(DestBusy, match=rf"pid {proc.pid}\b"):
            Journal.open(tmp_path, {"source": "s"})
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    Journal.open(tmp_path, {"source": "s"}).close()


def test_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    j = Journal.open(tmp_path, FP)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        time.sleep(5)
        os._exit(0)
    try:
        j.close()
        Journal.open(tmp_path, FP).close()  # the child still runs, yet DEST is free
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_writes_from_another_thread_are_refused(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    with Journal.open(tmp_path, FP) as j:
        t = threading.Thread(target=lambda: _catch(errors, j.finish_listing))
        t.start()
        t.join()
        assert len(errors) == 1 and isinstance(errors[0], sqlite3.ProgrammingError)
        assert not j.totals().listing_done


def _catch(errors: list[BaseException], fn: object) -> None:
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:
        errors.append(exc)


# ---------------------------------------------------------------------------- resume


def test_resume_after_reopen(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        assert j.resume_point() == (0, None, False)
        add_pages(j, range(5))
        for seq in (0, 1, 3):
            j.page_done(PageReport(seq, 10, 100))
    with Journal.open(tmp_path, FP) as j:
        assert j.resumed
        assert [p[:2] for p in j.pending_pages()] == [(2, "t2"), (4, "t4")]
        assert j.resume_point() == (5, "t5", False)
        t = j.totals()
        assert (t.pages_listed, t.pages_done, t.files_listed, t.files_ok, t.bytes) == (
            5, 3, 50, 30, 300)
        j.add_page(5, "t5", None, 4)  # the last page completes listing
        assert j.resume_point() == (6, None, True)
        assert j.totals().listing_done


def test_first_page_pending_has_token_none(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        j.add_page(0, None, "t1", 10)
    with Journal.open(tmp_path, FP) as j:
        assert j.resumed and [p[:2] for p in j.pending_pages()] == [(0, None)]


def test_finish_listing(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(2))
        j.finish_listing()
    with Journal.open(tmp_path, FP) as j:
        assert j.resume_point() == (2, "t2", True) and j.totals().listing_done


def test_add_page_again_is_idempotent(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(3))
        j.add_page(1, "t1", "t2", 12)  # re-listed on resume, the server now says 12 names
        t = j.totals()
        assert (t.pages_listed, t.files_listed) == (3, 32)
        with pytest.raises(ValueError, match="page 1 is already journaled"):
            j.add_page(1, "other", "t2", 10)


# ---------------------------------------------------------------------------- token loop


def test_token_loop_names_both_pages(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(7))
        with pytest.raises(TokenLoop) as info:
            j.add_page(7, "t3", "t4", 10)
        assert str(info.value) == (
            "page 7's token was already listed as page 3: the server's pagination loops")
        assert (info.value.seq, info.value.first_seq) == (7, 3)
        assert isinstance(info.value, BulkfetchError) and not isinstance(info.value, UsageError)
        with pytest.raises(TokenLoop, match="page 8's token was already listed as page 0"):
            j.add_page(8, None, "t1", 10)
        assert j.totals().pages_listed == 7  # the refused pages were not journaled
        assert j.resume_point() == (7, "t7", False)


# ---------------------------------------------------------------------------- failures


def test_page_done_with_failures(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(3))
        j.page_done(PageReport(2, 8, 800, (Failure("z", "HTTP 404", 1), Failure("a", "t/o", 9))))
        j.page_done(PageReport(0, 9, 900, (Failure("m", "HTTP 403", 1),)))
        assert j.failures() == [Failure("m", "HTTP 403", 1), Failure("a", "t/o", 9),
                                Failure("z", "HTTP 404", 1)]
        assert j.failures(limit=2) == [Failure("m", "HTTP 403", 1), Failure("a", "t/o", 9)]
        assert j.failure_count() == 3
        assert list(j.failed_names()) == [(0, "m"), (2, "a"), (2, "z")]
        t = j.totals()
        assert (t.pages_listed, t.pages_done, t.files_listed, t.files_ok, t.files_failed,
                t.bytes) == (3, 2, 30, 17, 3, 1700)
        assert t.started_at <= t.updated_at <= time.time()
        with pytest.raises(ValueError, match="never journaled"):
            j.page_done(PageReport(9, 1, 1))


def test_same_name_failing_twice_is_one_failure(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(2))
        j.page_done(PageReport(0, 9, 9, (Failure("dup", "HTTP 500", 3),)))
        j.page_done(PageReport(1, 9, 9, (Failure("dup", "HTTP 404", 1),)))
        assert j.failures() == [Failure("dup", "HTTP 404", 1)]
        assert list(j.failed_names()) == [(1, "dup")]  # upserted: the latest page
        assert j.totals().files_failed == 1 == j.failure_count()


def test_hostile_names_round_trip(tmp_path: Path) -> None:
    names = ["nul\x00byte", "lone\udcff surrogate", "../x", "", "é"]
    with Journal.open(tmp_path, FP) as j:
        j.add_page(0, None, "next\ud800", 5)
        j.add_page(1, "next\ud800", None, 5)
        j.page_done(PageReport(0, 0, 0, tuple(Failure(n, f"bad {n}", 1) for n in names)))
        assert sorted(n for _, n in j.failed_names()) == sorted(names)
        assert [p[:2] for p in j.pending_pages()] == [(1, "next\ud800")]
        j.retry_succeeded(["lone\udcff surrogate", "nul\x00byte"])
        assert sorted(f.name for f in j.failures()) == sorted(["../x", "", "é"])
    assert {f.name for f in read_status(tmp_path).failures} == {"../x", "", "é"}


def test_retry_succeeded_moves_counts(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(2))
        j.page_done(PageReport(0, 7, 70, tuple(Failure(n, "HTTP 503", 9) for n in "abc")))
        j.page_done(PageReport(1, 9, 90, (Failure("d", "HTTP 503", 9),)))
        # a --retry-failed pass: a and d succeed, b fails again, c is not retried
        retried = list(j.failed_names())
        assert retried == [(0, "a"), (0, "b"), (0, "c"), (1, "d")]
        j.page_done(PageReport(0, 1, 10, (Failure("b", "HTTP 404", 1),)))
        j.retry_succeeded(iter(["a", "d", "never-failed"]))
        assert j.failures() == [Failure("b", "HTTP 404", 10), Failure("c", "HTTP 503", 9)]
        t = j.totals()
        assert (t.files_ok, t.files_failed, t.bytes, t.pages_done) == (18, 2, 170, 2)
        j.retry_succeeded(["a"])  # again: no effect
        assert dataclasses.replace(j.totals(), updated_at=t.updated_at) == t
    conn = sqlite3.connect(db_path(tmp_path))
    assert conn.execute("SELECT seq, ok, failed FROM pages ORDER BY seq").fetchall() == [
        (0, 8, 2), (1, 10, 0)]


def test_failed_names_streams_in_order_while_retrying(tmp_path: Path) -> None:
    n = 2500
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(3), count=n)
        for seq in range(3):
            j.page_done(PageReport(seq, 0, 0, tuple(Failure(f"{seq}-{i:05d}", "x", 1)
                                                     for i in range(n))))
        seen = []
        for seq, name in j.failed_names():
            seen.append((seq, name))
            if name.endswith("0"):
                j.retry_succeeded([name])  # interleaved writes do not disturb the stream
        assert seen == [(s, f"{s}-{i:05d}") for s in range(3) for i in range(n)]
        assert j.failure_count() == 3 * n - 3 * n // 10
        assert j.totals().files_ok == 3 * n // 10


def test_failures_keep_their_url(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(2))
        j.page_done(PageReport(0, 0, 0, (Failure("a", "HTTP 503", 9, "http://h/get/a"),
                                         Failure("b", "unsafe name: x", 0))))
        assert j.failures() == [Failure("a", "HTTP 503", 9, "http://h/get/a"),
                                Failure("b", "unsafe name: x", 0)]
        # a retry pass that fails before any transfer keeps the URL known; a new one wins
        j.page_done(PageReport(0, 0, 0, (Failure("a", "no space", 0),
                                         Failure("b", "HTTP 404", 1, "http://h/get/b"))))
        assert [f for _, f in j.failure_rows()] == [
            Failure("a", "no space", 9, "http://h/get/a"),
            Failure("b", "HTTP 404", 1, "http://h/get/b")]
    conn = sqlite3.connect(db_path(tmp_path))
    assert conn.execute("SELECT name, url FROM failures ORDER BY name").fetchall() == [
        ("a", "http://h/get/a"), ("b", "http://h/get/b")]


def test_a_journal_from_before_failure_urls_gains_the_column(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Schema 1 as it first shipped had no failures.url: such a journal resumes, and the
    column is added (NULL for the failures it already holds)."""
    import re

    from bulkfetch.dest import journal as journal_module

    old_schema, removed = re.subn(r",\n\s*url TEXT[^\n]*", "", journal_module._SCHEMA)
    assert removed == 1
    with monkeypatch.context() as patch:
        patch.setattr(journal_module, "_SCHEMA", old_schema)
        with Journal.open(tmp_path, FP) as j:
            add_pages(j, range(2))
    conn = sqlite3.connect(db_path(tmp_path))
    with conn:  # what the old page_done wrote
        conn.execute("UPDATE pages SET status = 'done', ok = 8, bytes = 80 WHERE seq = 0")
        conn.executemany("INSERT INTO failures (name, seq, reason, attempts, at) "
                         "VALUES (?, 0, ?, ?, 0)", [("a", "HTTP 404", 1), ("b", "HTTP 503", 9)])

    def columns() -> list[str]:
        return [row[1] for row in conn.execute("PRAGMA table_info(failures)")]

    assert "url" not in columns()
    assert read_status(tmp_path).failures == (Failure("a", "HTTP 404", 1),
                                              Failure("b", "HTTP 503", 9))  # reads it as is
    with Journal.open(tmp_path, FP) as j:
        assert j.resumed and columns()[-1] == "url"
        assert j.failures() == [Failure("a", "HTTP 404", 1), Failure("b", "HTTP 503", 9)]
        j.page_done(PageReport(0, 1, 10, (Failure("b", "HTTP 503", 1, "http://h/b"),)))
        j.retry_succeeded(["a"])
        j.page_done(PageReport(1, 9, 90, (Failure("c", "HTTP 410", 1, "http://h/c"),)))
        assert list(j.failure_rows()) == [(0, Failure("b", "HTTP 503", 10, "http://h/b")),
                                          (1, Failure("c", "HTTP 410", 1, "http://h/c"))]
        t = j.totals()
        assert (t.files_ok, t.files_failed, t.bytes, t.pages_done) == (18, 2, 180, 2)
    with Journal.open(tmp_path, FP) as j:  # opened again: nothing left to add
        assert columns().count("url") == 1 and j.failure_count() == 2
    conn.close()


# ---------------------------------------------------------------------------- status


def test_read_status_while_a_subprocess_runs_then_after(tmp_path: Path) -> None:
    proc = start_child(HOLDER, str(tmp_path))
    try:
        status = read_status(tmp_path)
        assert status.state == "running" and status.pid == proc.pid
        assert status.totals.pages_listed == 1 and status.fingerprint == {"source": "s"}
        assert f"running (pid {proc.pid})" in render_status(status)
    finally:
        proc.communicate("\n", timeout=30)
    status = read_status(tmp_path)
    assert status.state == "finished" and status.pid is None
    assert status.totals.files_ok == 3


def test_read_status_after_kill_says_interrupted(tmp_path: Path) -> None:
    proc = start_child(HOLDER, str(tmp_path))
    proc.kill()
    proc.wait()
    status = read_status(tmp_path)
    assert status.state == "interrupted"
    assert "rerun the same command to resume" in render_status(status)
    with Journal.open(tmp_path, {"source": "s"}) as j:  # the lock died with the process
        assert j.resumed and [p[:2] for p in j.pending_pages()] == [(0, None)]


def test_status_states_and_render(tmp_path: Path) -> None:
    with pytest.raises(NoJournal, match=f"{tmp_path} has no bulkfetch journal"):
        read_status(tmp_path)
    with pytest.raises(NoJournal, match=f"{tmp_path}/gone does not exist"):
        read_status(tmp_path / "gone")
    assert not (tmp_path / ".bulkfetch").exists()  # status created nothing
    with Journal.open(tmp_path, FP):
        pass
    assert read_status(tmp_path).state == "empty"
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(2))
        j.record_error("listing failed: HTTP 500 on page 2")
    status = read_status(tmp_path)
    assert status.state == "interrupted"
    assert status.last_error == "listing failed: HTTP 500 on page 2"
    assert "last error: listing failed: HTTP 500 on page 2" in render_status(status)
    with Journal.open(tmp_path, FP) as j:
        j.page_done(PageReport(0, 10, 10_000))
        j.page_done(PageReport(1, 9, 9_000, (Failure("bad", "HTTP 404", 1),)))
        j.finish_listing()
    status = read_status(tmp_path)
    assert status.state == "finished with failures" and status.last_error is None
    assert status.failures == (Failure("bad", "HTTP 404", 1),)
    text = render_status(status)
    assert text.splitlines()[0] == f"{tmp_path}: finished with failures"
    assert "source: http://127.0.0.1:8000" in text
    assert "19 ok, 1 failed, 20 listed; 19.0 kB fetched" in text
    assert "'bad': HTTP 404 (1 attempts)" in text and "--retry-failed" in text
    with Journal.open(tmp_path, FP) as j:
        j.retry_succeeded(["bad"])
    status = read_status(tmp_path)
    assert status.state == "finished" and status.failures == ()
    assert status.totals.files_ok == 20


def test_status_cuts_long_names_and_advises_no_retry_for_unsafe_ones(tmp_path: Path) -> None:
    long = "deep-" + "y" * 5000
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(1))
        j.page_done(PageReport(0, 8, 8_000, (
            Failure(long, "unsafe name: name longer than 4000 bytes", 0),
            Failure("bad\x1b[2J", "unsafe name: name contains NUL or control characters", 0))))
        j.finish_listing()
    text = render_status(read_status(tmp_path))
    assert len(max(text.splitlines(), key=len)) < 400
    assert "(5,005 characters)" in text and "'bad\\x1b[2J'" in text and "\x1b" not in text
    assert "--retry-failed" not in text and "a retry would refuse it again" in text
    assert "refused before any request" in text


def test_status_shows_at_most_20_failures(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        j.add_page(0, None, None, 50)
        j.page_done(PageReport(0, 0, 0, tuple(Failure(f"f{i:02d}", "x", 1) for i in range(50))))
    status = read_status(tmp_path)
    assert len(status.failures) == 20 and status.totals.files_failed == 50
    assert "failures (first 20 of 50)" in render_status(status)


# ---------------------------------------------------------------------------- bad journals


def test_corrupt_journal_is_a_clear_error(tmp_path: Path) -> None:
    db_path(tmp_path).parent.mkdir()
    db_path(tmp_path).write_bytes(b"this is not sqlite at all" * 200)
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(tmp_path, FP)
    msg = str(info.value)
    assert str(db_path(tmp_path)) in msg and "not a valid bulkfetch journal" in msg
    assert "--restart" in msg and isinstance(info.value, UsageError)
    with pytest.raises(JournalCorrupt, match="--restart"):
        read_status(tmp_path)
    with Journal.open(tmp_path, FP, restart=True) as j:
        assert j.totals().pages_listed == 0
    assert read_status(tmp_path).state == "empty"


def journal_changed_by(dest: Path, sql: str) -> None:
    """A journal made in `dest`, then changed behind bulkfetch's back by `sql`."""
    with Journal.open(dest, FP):
        pass
    conn = sqlite3.connect(db_path(dest))
    conn.execute(sql)
    conn.commit()
    conn.close()


def test_other_schema_version_and_foreign_database(tmp_path: Path) -> None:
    journal_changed_by(tmp_path, "PRAGMA user_version = 7")
    with pytest.raises(JournalCorrupt, match=r"another bulkfetch version.*schema 7"):
        Journal.open(tmp_path, FP)
    db_path(tmp_path).unlink()
    conn = sqlite3.connect(db_path(tmp_path))
    conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(JournalCorrupt, match="is not a bulkfetch journal"):
        Journal.open(tmp_path, FP)
    with pytest.raises(JournalCorrupt, match="is not a bulkfetch journal"):
        read_status(tmp_path)


def test_state_dir_symlink_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / ".bulkfetch").symlink_to(elsewhere)
    with pytest.raises(JournalCorrupt, match="symlink"):
        Journal.open(dest, FP)
    assert list(elsewhere.iterdir()) == []


# ---------------------------------------------------------------------------- crash


CRASHER = """
import sys
from pathlib import Path
from bulkfetch.dest.journal import Journal
from bulkfetch.models import Failure, PageReport
j = Journal.open(Path(sys.argv[1]), {"source": "s"})
print("ready", flush=True)
for seq in range(1_000_000):
    j.add_page(seq, None if seq == 0 else f"t{seq}", f"t{seq + 1}", 10)
    fails = (Failure(f"{seq}-a", "HTTP 500", 3), Failure("dup", "HTTP 404", 1))
    j.page_done(PageReport(seq, 8, 8 * 100, fails))
    if seq % 50 == 0:
        print(seq, flush=True)
"""


def test_kill_9_mid_run_leaves_a_consistent_journal(tmp_path: Path) -> None:
    proc = start_child(CRASHER, str(tmp_path))
    assert proc.stdout is not None
    for line in proc.stdout:
        if int(line) >= 400:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    status = read_status(tmp_path)  # readable as left, before any recovery by a writer
    assert status.state == "interrupted"
    with Journal.open(tmp_path, {"source": "s"}) as j:
        t = j.totals()
        pending = j.pending_pages()
        next_seq, token, listing_done = j.resume_point()
    assert status.totals.pages_done == t.pages_done
    assert t.pages_done >= 400 and not listing_done
    conn = sqlite3.connect(db_path(tmp_path))
    row = conn.execute("SELECT count(*), sum(status = 'done'), sum(count), sum(ok), sum(bytes), "
                       "sum(failed), max(seq) FROM pages").fetchone()
    (n_failures,) = conn.execute("SELECT count(*) FROM failures").fetchone()
    assert row == (t.pages_listed, t.pages_done, t.files_listed, t.files_ok, t.bytes,
                   t.files_failed, next_seq - 1)
    assert n_failures == t.files_failed == t.pages_done + 1  # one own per page + "dup"
    assert t.files_ok == 8 * t.pages_done and t.bytes == 800 * t.pages_done
    # each page's failed count equals its rows in failures
    assert conn.execute("SELECT count(*) FROM pages p WHERE failed != "
                        "(SELECT count(*) FROM failures f WHERE f.seq = p.seq)").fetchone() == (0,)
    # at most the page being worked on is pending, and listing resumes after the last page
    assert len(pending) <= 1 and all(seq == next_seq - 1 for seq, _, _ in pending)
    assert token == f"t{next_seq}"


def test_a_sync_starts_a_new_pass_only_over_a_complete_run(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        add_pages(j, range(2))
        j.page_done(PageReport(0, 9, 90, (Failure("f", "HTTP 500", 9),)))
        assert not j.start_new_pass()  # listing not done: an interrupted run resumes
        j.add_page(2, tok(2), None, 10)
        assert not j.start_new_pass()  # listed, pages 1 and 2 not done
        j.page_done(PageReport(1, 10, 100))
        j.page_done(PageReport(2, 10, 100))
        assert j.start_new_pass()
        totals = j.totals()
        assert (totals.pages_listed, totals.files_ok, totals.files_failed, totals.bytes,
                totals.listing_done) == (0, 0, 0, 0, False)
        assert j.resume_point() == (0, None, False) and j.failures() == []
        add_pages(j, range(1))  # the new pass journals from its first page again
        assert j.totals().pages_listed == 1


@pytest.mark.parametrize("errno_", [errno.EROFS, errno.EACCES])
def test_a_dest_that_cannot_be_written_is_the_users_to_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_: int) -> None:
    """Read-only storage or permissions: a usage error naming DEST (exit 2), not an I/O
    error whose advice is to rerun the same command."""
    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno_, os.strerror(errno_), str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(DestNotWritable, match=rf"cannot write to DEST {tmp_path / 'd'}: "
                                              rf"{os.strerror(errno_)}"):
        Journal.open(tmp_path / "d", FP)


def test_a_file_in_the_way_of_dest_is_the_users_to_fix(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DestNotWritable, match="Not a directory") as caught:
        Journal.open(tmp_path / "afile" / "d", FP)
    assert f"({tmp_path / 'afile' / 'd'})" in str(caught.value)  # the path the OS refused


def test_a_journal_whose_run_record_is_gone_is_called_damaged(tmp_path: Path) -> None:
    journal_changed_by(tmp_path, "DELETE FROM run")
    with pytest.raises(JournalCorrupt, match="no run record"):
        Journal.open(tmp_path, FP)


def test_a_lock_that_cannot_be_opened_is_a_journal_error_naming_the_state(
        tmp_path: Path) -> None:
    from bulkfetch.errors import JournalIOError

    state = tmp_path / ".bulkfetch"
    state.mkdir()
    (state / "lock").symlink_to(tmp_path / "elsewhere")  # never followed (O_NOFOLLOW)
    with pytest.raises(JournalIOError, match="cannot create the journal in"):
        Journal.open(tmp_path, FP)
    assert not (tmp_path / "elsewhere").exists()


def test_page_tokens_and_the_pass_key_read_back_what_was_journaled(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        assert j.pass_key() is None  # no page listed yet
        j.add_page(0, None, "t1", 10)
        j.add_page(1, "t1", None, 10)  # the last page: no next token
        key = j.pass_key()
        assert isinstance(key, float) and abs(key - time.time()) < 60
        assert sorted(j.page_tokens(), key=str) == sorted([("", "t1"), ("t1", None)], key=str)


def test_an_unreadable_fingerprint_is_called_damaged(tmp_path: Path) -> None:
    journal_changed_by(tmp_path, "UPDATE run SET fingerprint = 'not json'")
    with pytest.raises(JournalCorrupt, match="unreadable fingerprint"):
        Journal.open(tmp_path, FP)


def test_a_fingerprint_difference_names_the_keys_that_differ(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP):
        pass
    other = {**FP, "shape": {"names_key": "Keys", "next_key": "NextMarker"}, "extra": [2, 1],
             "sink": "tar"}
    with pytest.raises(JournalMismatch) as caught:
        Journal.open(tmp_path, other)
    assert caught.value.differences == (
        'extra: (absent) vs [2, 1]', 'shape.names_key: "FileNames" vs "Keys"',
        'sink: {"fanout": 0, "kind": "dir"} vs "tar"')  # a dict against a value: whole


def test_each_write_stamps_the_run_and_totals_are_values(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        before = j.totals().updated_at
        time.sleep(0.01)
        j.add_page(0, None, "t1", 10)
        totals = j.totals()
        assert totals.updated_at > before and totals.pages_listed == 1
        with pytest.raises(dataclasses.FrozenInstanceError):
            totals.pages_listed = 2  # type: ignore[misc]


def test_a_journal_without_its_run_table_is_called_damaged(tmp_path: Path) -> None:
    journal_changed_by(tmp_path, "DROP TABLE run")
    with pytest.raises(JournalCorrupt, match=r"is damaged \(no such table: run\)"):
        Journal.open(tmp_path, FP)


def test_a_closed_journal_refuses_use(tmp_path: Path) -> None:
    j = Journal.open(tmp_path, FP)
    j.close()
    with pytest.raises(RuntimeError, match="closed"):
        j.add_page(0, None, "t1", 10)
    j.close()  # twice: nothing more to close
    with Journal.open(tmp_path, FP):  # the lock went with the first close
        pass


class FailingConnection:
    """A journal's connection whose statements starting with `words` raise `error`."""

    def __init__(self, conn: sqlite3.Connection, words: str, error: Exception) -> None:
        self.conn, self.words, self.error = conn, words, error

    def execute(self, sql: str, *args: object) -> object:
        if sql.lstrip().startswith(self.words):
            raise self.error
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.conn, name)


@pytest.mark.parametrize(("error", "raised", "words"), [
    (sqlite3.OperationalError("disk I/O error"), "JournalIOError", "cannot use the journal"),
    (sqlite3.DatabaseError("database disk image is malformed"), "JournalCorrupt",
     "is damaged"),
    (sqlite3.ProgrammingError("wrong thread"), "ProgrammingError", "wrong thread"),
])
def test_sqlite_errors_in_use_are_translated_and_bugs_are_not(
        tmp_path: Path, error: Exception, raised: str, words: str) -> None:
    with Journal.open(tmp_path, FP) as j:
        real = j._conn
        assert real is not None
        j._conn = FailingConnection(real, "SELECT", error)  # type: ignore[assignment]
        try:
            with pytest.raises(Exception, match=words) as caught:
                j.pending_pages()
            assert type(caught.value).__name__ == raised
        finally:
            j._conn = real


@pytest.mark.parametrize(("words", "error", "raised"), [
    ("PRAGMA journal_mode", sqlite3.OperationalError("disk I/O error"), "cannot open"),
    ("PRAGMA journal_mode", sqlite3.DatabaseError("file is not a database"), "is damaged"),
    ("UPDATE run SET last_error", sqlite3.OperationalError("attempt to write a readonly "
                                                           "database"), "cannot write"),
])
def test_sqlite_errors_on_open_are_translated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              words: str, error: Exception,
                                              raised: str) -> None:
    from bulkfetch.dest import journal as journal_module

    with Journal.open(tmp_path, FP):
        pass
    connect = sqlite3.connect
    monkeypatch.setattr(journal_module.sqlite3, "connect",
                        lambda *a, **k: FailingConnection(connect(*a, **k), words, error))
    with pytest.raises(BulkfetchError, match=raised):
        Journal.open(tmp_path, FP)
    monkeypatch.setattr(journal_module.sqlite3, "connect", connect)
    with Journal.open(tmp_path, FP):  # nothing was left locked or open
        pass


def test_a_journal_that_cannot_be_opened_at_all_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bulkfetch.dest import journal as journal_module
    from bulkfetch.errors import JournalIOError

    def refuse(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(journal_module.sqlite3, "connect", refuse)
    with pytest.raises(JournalIOError, match="cannot open the journal"):
        Journal.open(tmp_path, FP)


def test_page_queries_read_tokens_back_as_they_went_in(tmp_path: Path) -> None:
    with Journal.open(tmp_path, FP) as j:
        assert j.last_page() is None and j.page_is_done(0) is False
        j.add_page(0, None, "t1", 10)
        j.add_page(1, "t1", None, 10)
        assert j.last_page() == (1, "t1")
        assert j.pending_pages() == [(0, None, "t1"), (1, "t1", None)]
        j.page_done(PageReport(0, 9, 90, (Failure("x", "HTTP 500", 3),)))
        assert j.page_is_done(0) is True and j.page_is_done(1) is False
        assert j.page_is_done(7) is False  # never listed
        assert j.failed_pages() == [(0, None, "t1")]
        assert j.start_new_pass() is False  # page 1 is not done: nothing starts over

