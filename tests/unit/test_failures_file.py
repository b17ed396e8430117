"""failures_file: every failure of the journal as a JSON line, written whole or not at all."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from bulkfetch.failures_file import http_status, write_failures
from bulkfetch.journal import Journal
from bulkfetch.models import Failure, PageReport


@pytest.mark.parametrize(("reason", "status"), [
    ("HTTP 404", 404), ("HTTP 503", 503), ("HTTP 416 (bytes 0-9)", 416),
    ("Connection reset by peer (curl error 56)", None),
    ("MD5 of the body does not match the server's ETag/Content-MD5", None),
    ("body of 3 bytes, HTTP 200 said 4", None)])
def test_http_status(reason: str, status: int | None) -> None:
    assert http_status(reason) == status


def test_every_failure_in_order_and_none_leaves_no_file(tmp_path: Path) -> None:
    with Journal.open(tmp_path, {"source": "s"}) as journal:
        assert write_failures(journal, tmp_path) is None
        for seq in range(3):
            journal.add_page(seq, f"t{seq}" if seq else None, f"t{seq + 1}", 1500)
            journal.page_done(PageReport(seq, 1000, 0, tuple(
                Failure(f"p{seq}/f{i:04d}", "HTTP 404", 2, f"http://h/p{seq}/f{i:04d}")
                for i in range(500))))
        path = write_failures(journal, tmp_path)
        assert path == tmp_path / ".bulkfetch" / "failures.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(lines) == 1500  # more than one chunk of the journal's reads
        assert lines[0] == {"url": "http://h/p0/f0000", "name": "p0/f0000",
                            "reason": "HTTP 404", "attempts": 2, "status": 404}
        assert [line["name"] for line in lines] == sorted(line["name"] for line in lines)
        journal.retry_succeeded(line["name"] for line in lines)
        assert write_failures(journal, tmp_path) is None and not path.exists()
        assert [p.name for p in (tmp_path / ".bulkfetch").iterdir()
                if p.name.startswith(".failures")] == []


def test_a_journal_from_before_urls_gains_the_column(tmp_path: Path) -> None:
    with Journal.open(tmp_path, {"source": "s"}):
        pass
    db = tmp_path / ".bulkfetch" / "journal.sqlite"
    conn = sqlite3.connect(db)  # as schema 1 first shipped: no url column
    conn.executescript("""
        CREATE TABLE old AS SELECT name, seq, reason, attempts, at FROM failures;
        DROP TABLE failures;
        CREATE TABLE failures (name PRIMARY KEY, seq INTEGER NOT NULL REFERENCES pages(seq),
            reason TEXT NOT NULL, attempts INTEGER NOT NULL, at REAL NOT NULL) WITHOUT ROWID;
        CREATE TRIGGER failures_ins AFTER INSERT ON failures BEGIN
            UPDATE pages SET failed = failed + 1 WHERE seq = NEW.seq; END;
        DROP TABLE old;""")
    conn.close()
    with Journal.open(tmp_path, {"source": "s"}) as journal:
        journal.add_page(0, None, None, 1)
        journal.page_done(PageReport(0, 0, 0, (Failure("x", "HTTP 410", 1, "http://h/x"),)))
        assert [f for _, f in journal.failure_rows()] == [
            Failure("x", "HTTP 410", 1, "http://h/x")]
