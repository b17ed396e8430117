"""A --retry-failed pass into tar shards, killed after a shard was indexed and before its
page report reached the journal: the next start finds the names that pass stored and takes
them out of the journal's failures (recover() does not replay a page that is done already)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkfetch.api import build_options
from bulkfetch.dest import index
from bulkfetch.dest.journal import Journal
from bulkfetch.models import Failure, PageReport
from bulkfetch.runners.coordinator import Coordinator as _Coordinator
from bulkfetch.runners.dest import journal_stored_retries as _journal_stored_retries
from bulkfetch.sources import make_source

MD5 = "0" * 32


def _journal_with_failures(dest: Path) -> Journal:
    """Page 3 done in an earlier run: 2 files ok (200 bytes), a, b and c failed."""
    journal = Journal.open(dest, {"source": "test", "sink": {"kind": "tar", "fanout": 0}})
    journal.add_page(3, "t3", None, 5)
    journal.page_done(PageReport(3, 2, 200, (Failure("a", "HTTP 500", 9),
                                             Failure("b", "HTTP 500", 9),
                                             Failure("c\udcff", "unsafe name", 0))))
    return journal


def _index_shard(dest: Path, file: str, report: PageReport,
                 members: list[tuple[str, int, int, str]]) -> None:
    """An indexed shard of worker 0 holding `members` and the report of one page."""
    conn = index.connect(dest, create=True)
    try:
        index.add_shard(conn, file, 0, 4096, 0.0, [report], members)
    finally:
        conn.close()


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    made = tmp_path / "dest"
    made.mkdir()
    return made


def test_names_a_killed_retry_pass_stored_leave_the_failures_with_their_bytes(
        dest: Path) -> None:
    journal = _journal_with_failures(dest)
    # The first run's shard holds page 3's report and its two good files.
    _index_shard(dest, "shard-000-000000.tar", PageReport(3, 2, 200),
                 [("x", 512, 100, MD5), ("y", 1536, 100, MD5)])
    # The retry pass stored a (70 bytes) but not b; killed before journaling the report.
    _index_shard(dest, "shard-000-000001.tar",
                 PageReport(3, 1, 70, (Failure("b", "HTTP 500", 9),)), [("a", 512, 70, MD5)])
    before = journal.totals()

    assert index.stored_after_failing(dest, journal.failed_names()) == {"a": 70}
    _journal_stored_retries(dest, journal)

    assert [name for _, name in journal.failed_names()] == ["b", "c\udcff"]
    after = journal.totals()
    assert (after.files_ok, after.files_failed) == (before.files_ok + 1,
                                                    before.files_failed - 1)
    assert after.bytes == before.bytes + 70
    _journal_stored_retries(dest, journal)  # again: nothing left to move
    assert journal.totals() == after
    journal.close()


def test_a_name_kept_from_before_a_restart_does_not_count_for_the_new_journal(
        dest: Path) -> None:
    # An earlier run stored a; --restart then forgot that shard's page reports.
    _index_shard(dest, "shard-000-000000.tar", PageReport(3, 3, 300), [("a", 512, 70, MD5)])
    index.forget_pages(dest)
    journal = _journal_with_failures(dest)  # the new run's page 3 failed a

    assert index.stored_after_failing(dest, journal.failed_names()) == {}
    _journal_stored_retries(dest, journal)
    assert [name for _, name in journal.failed_names()] == ["a", "b", "c\udcff"]
    journal.close()


def test_no_index_means_nothing_stored(tmp_path: Path) -> None:
    assert index.stored_after_failing(tmp_path, iter([(0, "a")])) == {}


def test_at_the_end_of_a_run_only_retry_pages_without_a_report_are_looked_at(
        dest: Path) -> None:
    journal = _journal_with_failures(dest)
    _index_shard(dest, "shard-000-000001.tar", PageReport(3, 1, 70), [("a", 512, 70, MD5)])
    (dest / "shard-000-000001.tar").write_bytes(b"")  # recover() keeps an indexed shard
    options = build_options("http://127.0.0.1:9", dest, workers=1, sink="tar")
    coordinator = _Coordinator(options, make_source(options), journal, None)

    coordinator._settle_shards()  # every retry report arrived: the failures are not scanned
    assert [name for _, name in journal.failed_names()] == ["a", "b", "c\udcff"]

    coordinator.retrying = {3: ("a", "b")}  # page 3's retry report never came up
    coordinator._settle_shards()
    assert [name for _, name in journal.failed_names()] == ["b", "c\udcff"]
    journal.close()
