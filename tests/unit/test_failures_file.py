"""failures_file: every failure of the journal as a JSON line, written whole or not at all."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkfetch.dest import failures_file
from bulkfetch.dest.failures_file import beside_report, failure_line, http_status, write_failures
from bulkfetch.dest.journal import Journal
from bulkfetch.models import Failure, PageReport


@pytest.mark.parametrize(("reason", "status"), [
    ("HTTP 404", 404), ("HTTP 503", 503), ("HTTP 410", 410), ("HTTP 304", 304),
    ("HTTP 416 (bytes 0-9)", 416),  # a piece of a split file (engine/big.py)
    ("HTTP 403 AccessDenied", 403), ("HTTP 503 SlowDown", 503),  # S3's error codes
    ("HTTP 0", None),  # no status line came
    ("Connection reset by peer (curl error 56)", None),
    ("HTTP/2 stream 1 was not closed cleanly: PROTOCOL_ERROR (curl error 92)", None),
    ("MD5 of the body does not match the server's ETag/Content-MD5", None),
    ("body of 3 bytes, Content-Length 4", None),
    ("range of 5 bytes, asked 10 (bytes 0-9)", None),
    ("unsafe name: '..' component", None),
    # a sink's reason about a directory that a hostile name called "HTTP 404"
    ("HTTP 404 is a symlink or a file, not a directory", None),
    ("cannot write HTTP 500 into /d: No space left on device", None)])
def test_http_status(reason: str, status: int | None) -> None:
    assert http_status(reason) == status


def test_a_line_per_failure_and_hostile_names_stay_exact() -> None:
    assert json.loads(failure_line(Failure("a/b", "HTTP 404", 2, "http://h/get/a/b"))) == {
        "url": "http://h/get/a/b", "name": "a/b", "reason": "HTTP 404", "attempts": 2,
        "status": 404}
    unknown = json.loads(failure_line(Failure("x", "not an http:// or https:// URL", 0)))
    assert unknown["url"] is None and unknown["status"] is None and unknown["attempts"] == 0
    for name in ("bad-\udcff", "lone-\ud800-high", "nul\x00", "new\nline", "é/ü"):
        line = failure_line(Failure(name, "unsafe name: x", 0, "http://h/get/x"))
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        line.decode("utf-8")  # strict: jq and pandas read it
        assert json.loads(line)["name"] == name
    assert "é/ü".encode() in failure_line(Failure("é/ü", "HTTP 404", 1))  # not \u-escaped


def test_a_secret_in_a_url_never_reaches_the_list(tmp_path: Path) -> None:
    with Journal.open(tmp_path, {"source": "s"}) as journal:
        journal.add_page(0, None, None, 1)
        journal.page_done(PageReport(0, 0, 0, (Failure(
            "f", "HTTP 403", 1, "https://user:hunter2@h/f?X-Amz-Signature=abcdef"),)))
        path = write_failures(journal, tmp_path)
    assert path is not None
    text = path.read_text()
    assert "hunter2" not in text and "abcdef" not in text
    assert json.loads(text)["url"].startswith("https://")


def fill(journal: Journal, pages: int, per_page: int) -> None:
    for seq in range(pages):
        journal.add_page(seq, f"t{seq}" if seq else None, f"t{seq + 1}", per_page)
        journal.page_done(PageReport(seq, 0, 0, tuple(
            Failure(f"p{seq}/f{i:06d}", "HTTP 404" if i % 2 else "timed out (curl error 28)",
                    1 + i % 3, f"http://h/p{seq}/f{i:06d}")
            for i in range(per_page))))


def test_every_failure_in_journal_order_and_none_leaves_no_file(tmp_path: Path) -> None:
    with Journal.open(tmp_path, {"source": "s"}) as journal:
        killed = tmp_path / ".bulkfetch" / ".failures.jsonl.99999.tmp"
        killed.write_text("part of a list: its writer was killed")
        assert write_failures(journal, tmp_path) is None and not killed.exists()
        fill(journal, 3, 500)
        path = write_failures(journal, tmp_path)
        assert path == tmp_path / ".bulkfetch" / "failures.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(lines) == 1500  # more than one chunk of the journal's reads
        assert lines[:2] == [
            {"url": "http://h/p0/f000000", "name": "p0/f000000",
             "reason": "timed out (curl error 28)", "attempts": 1, "status": None},
            {"url": "http://h/p0/f000001", "name": "p0/f000001", "reason": "HTTP 404",
             "attempts": 2, "status": 404}]
        assert [line["name"] for line in lines] == [
            f"p{seq}/f{i:06d}" for seq in range(3) for i in range(500)]
        journal.retry_succeeded(line["name"] for line in lines)  # a retry that fixed all
        assert write_failures(journal, tmp_path) is None and not path.exists()
        assert sorted(p.name for p in (tmp_path / ".bulkfetch").iterdir()
                      if "failures" in p.name) == []


def test_streamed_memory_does_not_grow_with_the_failures(tmp_path: Path) -> None:
    with Journal.open(tmp_path, {"source": "s"}) as journal:
        fill(journal, 5, 8_000)
        tracemalloc.start()
        try:
            path = write_failures(journal, tmp_path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert path is not None
    assert sum(1 for _ in path.open("rb")) == 40_000
    # 40,000 Failures held at once would take about 10 MB; one chunk of the journal's
    # reads (1,000 rows) and a buffer take well under 1 MB
    assert peak < 1 << 20, peak


class BrokenJournal:
    """Yields a few failures, then fails like a journal on a dying disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen_old: list[bytes] = []

    def failure_count(self) -> int:
        return 3

    def failure_rows(self) -> Iterator[tuple[int, Failure]]:
        for i in range(2):
            self.seen_old.append(self.path.read_bytes())  # the old list stands meanwhile
            yield 0, Failure(f"n{i}", "HTTP 500", 1)
        raise OSError(5, "Input/output error")


def test_a_failed_write_leaves_no_part_and_no_stale_list(tmp_path: Path) -> None:
    state = tmp_path / ".bulkfetch"
    state.mkdir()
    old = state / "failures.jsonl"
    old.write_bytes(b'{"name": "old"}\n')
    journal = BrokenJournal(old)
    with pytest.raises(OSError, match="Input/output"):
        write_failures(journal, tmp_path)  # type: ignore[arg-type]
    assert journal.seen_old == [b'{"name": "old"}\n'] * 2  # replaced by rename, not in place
    assert list(state.iterdir()) == []  # no temporary file; the old list is not this run's


def test_the_rename_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Journal.open(tmp_path, {"source": "s"}) as journal:
        fill(journal, 1, 10)
        renamed: list[tuple[str, str]] = []

        def replace(src: str, dst: str) -> None:
            renamed.append((Path(src).name, Path(dst).name))
            assert len(Path(src).read_text().splitlines()) == 10  # whole before the rename
            real_replace(src, dst)

        real_replace = failures_file.os.replace
        monkeypatch.setattr(failures_file.os, "replace", replace)
        path = write_failures(journal, tmp_path)
    assert path is not None and renamed == [(f".failures.jsonl.{failures_file.os.getpid()}.tmp",
                                             "failures.jsonl")]


def test_beside_report(tmp_path: Path) -> None:
    source = tmp_path / "list.jsonl"
    source.write_bytes(b'{"name": "a"}\n')
    report = tmp_path / "out" / "run.json"
    report.parent.mkdir()
    assert beside_report(report, str(source)) == str(tmp_path / "out" / "run.failures.jsonl")
    assert (tmp_path / "out" / "run.failures.jsonl").read_bytes() == source.read_bytes()
    assert beside_report(report, None) is None  # a run with none: the older copy goes
    assert list(report.parent.iterdir()) == []
    with pytest.raises(OSError):
        beside_report(report, str(tmp_path / "missing.jsonl"))
    assert list(report.parent.iterdir()) == []
