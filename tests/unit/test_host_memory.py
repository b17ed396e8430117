"""What --concurrency auto learned of hosts, kept in DEST's journal file for the next run
(dest/host_memory.py)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from bulkfetch.dest import host_memory
from bulkfetch.dest.journal import Journal


def journal_in(dest: Path) -> Path:
    with Journal.open(dest, {"source": "http://a"}):
        pass
    return dest / ".bulkfetch" / "journal.sqlite"


def test_what_workers_learned_comes_back_merged_per_host(tmp_path: Path) -> None:
    journal_in(tmp_path)
    host_memory.remember(tmp_path, [("http://a", 40, 0.002), ("http://a", 60, 0.001),
                                    ("http://b", 8, 0.0)])
    assert host_memory.recall(tmp_path) == (("http://a", 50, 0.001), ("http://b", 8, 0.0))
    host_memory.remember(tmp_path, [("http://a", 12, 0.004)])  # a later run's, in its place
    assert host_memory.recall(tmp_path)[0] == ("http://a", 12, 0.004)


def test_a_journal_without_memory_and_the_journal_itself_are_read_as_before(
        tmp_path: Path) -> None:
    assert host_memory.recall(tmp_path) == ()  # no DEST yet
    path = journal_in(tmp_path)
    assert host_memory.recall(tmp_path) == ()  # a journal an older bulkfetch wrote
    host_memory.remember(tmp_path, [("http://a", 9, 0.01)])
    with Journal.open(tmp_path, {"source": "http://a"}) as journal:  # the table is extra
        assert journal.totals().pages_listed == 0
    assert host_memory.recall(tmp_path) == (("http://a", 9, 0.01),)
    assert path.is_file()


def test_nothing_is_written_where_no_journal_is(tmp_path: Path) -> None:
    (tmp_path / ".bulkfetch").mkdir()
    host_memory.remember(tmp_path, [("http://a", 9, 0.01)])
    assert not (tmp_path / ".bulkfetch" / "journal.sqlite").exists()  # no file a journal
    # would then refuse as "not a bulkfetch journal"


def test_stale_memory_and_more_than_a_few_hosts_are_left_out(tmp_path: Path) -> None:
    path = journal_in(tmp_path)
    host_memory.remember(tmp_path, [(f"http://h{i}", i + 1, 0.0) for i in range(20)])
    kept = host_memory.recall(tmp_path)
    assert [host for host, _, _ in kept] == [f"http://h{i}" for i in range(19, 11, -1)]
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE host_memory SET at = ?", (time.time() - 8 * 24 * 3600,))
    assert host_memory.recall(tmp_path) == ()


def test_a_damaged_file_is_advice_ignored(tmp_path: Path) -> None:
    state = tmp_path / ".bulkfetch"
    state.mkdir()
    (state / "journal.sqlite").write_bytes(b"not a database at all" * 100)
    assert host_memory.recall(tmp_path) == ()
    host_memory.remember(tmp_path, [("http://a", 9, 0.01)])  # no error either
