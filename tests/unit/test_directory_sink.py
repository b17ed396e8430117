"""The directory sink on its own: files appear whole under their names, replace what a
previous run left, never follow a planted symlink, leave no temporary files, and record the
MD5 of what they wrote as md5sum lines at each page end."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkfetch.models import PageReport
from bulkfetch.sinks.base import SinkFailure, SinkFatal, Spool
from bulkfetch.sinks.directory import SUMS_DIR, TMP_DIR, DirectorySink, fence
from bulkfetch.sinks.null import NullSink


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[DirectorySink]:
    dest = tmp_path / "dest"
    (dest / TMP_DIR).mkdir(parents=True)
    made = DirectorySink(dest, 0)
    yield made
    made.close()
    assert os.listdir(dest / TMP_DIR) == []


def test_files_land_whole_in_subdirectories(sink: DirectorySink) -> None:
    sink.write("a/b/c.bin", b"x" * 5000)
    sink.write("top", b"")
    assert (sink.dest / "a/b/c.bin").read_bytes() == b"x" * 5000
    assert (sink.dest / "top").read_bytes() == b""
    assert oct((sink.dest / "top").stat().st_mode & 0o777) == "0o644"


def test_a_rerun_replaces_the_old_file(sink: DirectorySink) -> None:
    sink.write("f", b"old body")
    sink.write("f", b"new")
    assert (sink.dest / "f").read_bytes() == b"new"


def test_a_planted_symlink_is_replaced_not_followed(sink: DirectorySink,
                                                   tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (sink.dest / "f").symlink_to(outside)
    sink.write("f", b"downloaded")
    assert outside.read_text() == "keep me"
    assert not (sink.dest / "f").is_symlink()
    assert (sink.dest / "f").read_bytes() == b"downloaded"


def test_a_directory_in_the_way_is_a_failure(sink: DirectorySink) -> None:
    (sink.dest / "d" / "inner").mkdir(parents=True)
    with pytest.raises(SinkFailure, match="directory is in the way"):
        sink.write("d", b"x")
    assert (sink.dest / "d" / "inner").is_dir()


def test_a_short_write_is_continued_until_the_body_is_whole(
        sink: DirectorySink, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    calls: list[int] = []

    def at_most_7_bytes(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        return real_write(fd, data[:7])

    monkeypatch.setattr("bulkfetch.sinks.directory.os.write", at_most_7_bytes)
    body = bytes(range(100))
    sink.write("flat", body)
    sink.write("sub/dir/nested", body[:50])
    assert (sink.dest / "flat").read_bytes() == body
    assert (sink.dest / "sub/dir/nested").read_bytes() == body[:50]
    assert calls[:3] == [100, 93, 86] and len(calls) == 15 + 8


def test_fanout_places_flat_and_nested_names_under_hash_directories(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / TMP_DIR).mkdir(parents=True)
    sink = DirectorySink(dest, 0, fanout=2)
    try:
        sink.write("flat", b"1")
        sink.write("a/b", b"2")
    finally:
        sink.close()
    for name, body in (("flat", b"1"), ("a/b", b"2")):
        digest = hashlib.md5(name.encode()).hexdigest()
        assert (dest / digest[:2] / digest[2:4] / name).read_bytes() == body
    assert not (dest / "flat").exists()


# -- bodies streamed to a spool -------------------------------------------------------------
BIG = bytes(range(256)) * 4099 + b"tail"  # not a multiple of any block


def spool(sink: DirectorySink | NullSink, name: str, body: bytes) -> Spool:
    spooled = sink.open_spool(name)
    for at in range(0, len(body), 65536):
        spooled.write(body[at : at + 65536])
    return spooled


def test_dir_a_spooled_file_appears_only_when_stored(sink: DirectorySink) -> None:
    spooled = spool(sink, "a/b/big.bin", BIG)
    assert not (sink.dest / "a").exists()
    sink.store_spool(0, "a/b/big.bin", spooled, len(BIG), hashlib.md5(BIG).hexdigest())
    assert (sink.dest / "a/b/big.bin").read_bytes() == BIG
    assert oct((sink.dest / "a/b/big.bin").stat().st_mode & 0o777) == "0o644"


def test_dir_a_spool_replaces_an_old_file_and_a_discarded_one_leaves_nothing(
        sink: DirectorySink) -> None:
    (sink.dest / "f").write_bytes(b"old")
    spool(sink, "f", b"half of it").discard()
    assert (sink.dest / "f").read_bytes() == b"old"
    spooled = spool(sink, "f", BIG)
    sink.store_spool(0, "f", spooled, len(BIG), "")
    assert (sink.dest / "f").read_bytes() == BIG


def test_dir_a_directory_in_the_way_fails_the_file_and_removes_the_spool(
        sink: DirectorySink) -> None:
    (sink.dest / "taken" / "inside").mkdir(parents=True)
    spooled = spool(sink, "taken", BIG)
    with pytest.raises(SinkFailure, match="a directory is in the way of taken"):
        sink.store_spool(0, "taken", spooled, len(BIG), "")
    spooled = spool(sink, "taken/inside/x", BIG)
    (sink.dest / "file").write_bytes(b"")
    spooled2 = spool(sink, "file/x", BIG)
    with pytest.raises(SinkFailure, match="not a directory"):
        sink.store_spool(0, "file/x", spooled2, len(BIG), "")
    sink.store_spool(0, "taken/inside/x", spooled, len(BIG), "")
    assert (sink.dest / "taken/inside/x").read_bytes() == BIG


def test_the_null_sink_keeps_no_partial_files() -> None:
    """None is what makes the fetcher stream such a file instead of fetching it by
    ranges it could never hash back."""
    assert NullSink().open_partial("key") is None


# -- the MD5s recorded for `bulkfetch hash --dest` -------------------------------------------
def md5(body: bytes) -> str:
    return hashlib.md5(body).hexdigest()


def test_each_page_end_appends_md5sum_lines_of_the_paths_under_dest(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / TMP_DIR).mkdir(parents=True)
    sink = DirectorySink(dest, 3, fanout=1)
    report = PageReport(seq=0, ok=2, bytes=0)
    try:
        sink.write("flat", b"1", md5(b"1"))
        sink.write("a/b", b"2", md5(b"2"))
        sink.write("unverified", b"3")  # --no-verify: no digest, no line
        assert not (dest / SUMS_DIR).exists()  # nothing before the page ends
        assert sink.end_page(report) == [report]
        spooled = spool(sink, "back\\slash", BIG)
        sink.store_spool(1, "back\\slash", spooled, len(BIG), md5(BIG))
        sink.end_page(report)
        sink.end_page(report)  # nothing new: nothing written
    finally:
        sink.close()
    (recorded,) = (dest / SUMS_DIR).iterdir()
    assert recorded.name.startswith("w3-")

    def where(name: str) -> str:
        return f"{hashlib.md5(name.encode()).hexdigest()[:2]}/{name}"

    tricky = "back\\slash"  # md5sum escapes the backslash and marks the line with one
    escaped = where(tricky).replace("\\", "\\\\")
    assert recorded.read_bytes().decode().splitlines() == [
        f"{md5(b'1')}  {where('flat')}", f"{md5(b'2')}  {where('a/b')}",
        "\\" + f"{md5(BIG)}  {escaped}"]


def test_checksums_that_cannot_be_recorded_stop_the_run(sink: DirectorySink) -> None:
    (sink.dest / ".bulkfetch" / "sums").write_text("a file where the directory goes")
    sink.write("a", b"1", md5(b"1"))
    with pytest.raises(SinkFatal, match=r"cannot record checksums in .*sums/w0-"):
        sink.end_page(PageReport(seq=0, ok=1, bytes=0))


def test_a_whole_answer_to_a_conditional_request_equal_to_the_file_leaves_it_be(
        sink: DirectorySink, tmp_path: Path) -> None:
    """get --sync against a server that ignores conditional requests: a 200's body equal to
    DEST's file leaves the file as it was (same inode and mtime) and counts; a different one,
    or one of another length, replaces it; a symlink in the way is never read through."""
    sink.write("same", b"bytes")
    sink.write("d/other", b"old bytes")
    sink.write("short", b"12345")
    before = os.stat(sink.dest / "same")
    outside = tmp_path / "outside"
    outside.write_bytes(b"bytes")
    (sink.dest / "link").symlink_to(outside)
    for name in ("same", "d/other", "short", "link"):
        sink.response_headers(name, [b"HTTP/1.1 200 OK\r\n"])
    sink.write("same", b"bytes", hashlib.md5(b"bytes").hexdigest())
    sink.write("d/other", b"new bytes")
    sink.write("short", b"1234")
    sink.write("link", b"bytes")
    after = os.stat(sink.dest / "same")
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sink.same_bodies == 1
    assert (sink.dest / "d/other").read_bytes() == b"new bytes"
    assert (sink.dest / "short").read_bytes() == b"1234"
    assert not (sink.dest / "link").is_symlink() and outside.read_bytes() == b"bytes"
    # its sums line is written again (with the validators of that answer beside it)
    sink.end_page(PageReport(0, ok=4, bytes=0))
    assert f"{hashlib.md5(b'bytes').hexdigest()}  same" in \
        (sink.dest / SUMS_DIR / sink.sums_name).read_text()
    # a later plain write of the name replaces as ever
    sink.write("same", b"bytes")
    assert os.stat(sink.dest / "same").st_ino != before.st_ino


def test_validators_are_kept_beside_the_sums_lines(sink: DirectorySink) -> None:
    sink.write("a", b"x", hashlib.md5(b"x").hexdigest())
    sink.keep_validators("a", '"5f-1"', "Sun, 29 Nov 2026 04:00:00 GMT")
    sink.end_page(PageReport(0, ok=1, bytes=0))
    companion = (sink.dest / SUMS_DIR / sink.sums_name).with_suffix(".http")
    assert companion.read_text() == '"5f-1" Sun,_29_Nov_2026_04:00:00_GMT  a\n'


def test_a_fenced_worker_stores_nothing_more(sink: DirectorySink) -> None:
    """The coordinator gave the worker up for lost (a Ray actor on a node cut off, its
    pages sent to others) and removed its temporary directory: whatever it finishes after
    that, small body, spooled one or resumable partial file, never lands in DEST."""
    sink.write("before", b"stored before the fence")
    spooled = spool(sink, "spooled", BIG)  # in flight across the fence
    partial = sink.open_partial("k" * 32)
    partial.write(BIG)
    fence(sink.dest, 0)
    assert not (sink.dest / TMP_DIR / "w0").exists()
    with pytest.raises(SinkFatal, match="given up for lost"):
        sink.write("after", b"written after the fence")
    with pytest.raises(SinkFatal, match="given up for lost"):
        sink.store_spool(0, "spooled", spooled, len(BIG), "")
    with pytest.raises(SinkFatal, match="given up for lost"):
        sink.store_spool(0, "partial", partial, len(BIG), "")
    assert sorted(os.listdir(sink.dest)) == [".bulkfetch", "before"]
    fence(sink.dest, 0)  # (again, or for a worker that never made one: nothing to do)
    fence(sink.dest, 7)
