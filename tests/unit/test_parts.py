"""Ranges of a big file on their own: when a file may be split, into which pieces, what a
piece trusts of an answer, the in-order hash of pieces written by offset into one spool file
(in line where hashing stands, else read back), and the resume record's layouts."""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
from concurrent.futures import Future
from pathlib import Path

import pytest

from bulkfetch.engine import resume
from bulkfetch.engine.parts import (
    CATCH_UP_MAX,
    PIECE_MIN,
    PIECES_MAX,
    Part,
    RangedFile,
    SplitPlan,
    piece_ranges,
    split_plan,
)
from bulkfetch.sinks.spool import FileSpool

TOTAL = 300_001
BODY = os.urandom(TOTAL)


def lines(*headers: str, status: str = "HTTP/1.1 200 OK") -> list[bytes]:
    return [f"{status}\r\n".encode(), *(f"{h}\r\n".encode() for h in headers), b"\r\n"]


SPLITTABLE = ("Content-Length: 1000", "Accept-Ranges: bytes", 'ETag: "abc"')


def test_a_file_goes_by_ranges_only_when_the_server_makes_it_safe() -> None:
    plan = split_plan(lines(*SPLITTABLE))
    # (its validator kept for get --sync: a strong ETag, else the date)
    assert plan == SplitPlan(1000, '"abc"', {}, kept=('"abc"', ""))
    assert split_plan(lines(*SPLITTABLE[:2])) is None  # no validator
    assert split_plan(lines(SPLITTABLE[0], SPLITTABLE[2])) is None  # no ranges
    assert split_plan(lines(*SPLITTABLE[1:])) is None  # no length
    assert split_plan(lines(*SPLITTABLE, status="HTTP/1.1 404 Not Found")) is None
    weak = split_plan(lines(*SPLITTABLE[:2], 'ETag: W/"abc"',
                            "Last-Modified: Wed, 01 Jan 2025 00:00:00 GMT"))
    assert weak is not None and weak.validator == "Wed, 01 Jan 2025 00:00:00 GMT"
    assert weak.kept == ("", "Wed, 01 Jan 2025 00:00:00 GMT")
    md5 = split_plan(lines(*SPLITTABLE, "Content-MD5: rL0Y20zC+Fzt72VPzMSk2A=="))
    assert md5 is not None and "md5" in md5.stated and md5.kept is None  # the sums line is


@pytest.mark.parametrize(("total", "connections"), [
    (10, 3), (8, 8), (1_000_001, 8), (7, 2), (64 << 20, 8), (1 << 30, 1), (4 << 30, 8),
    (100 << 30, 8)])
def test_pieces_cover_the_file_once_in_order(total: int, connections: int) -> None:
    got = piece_ranges(total, connections)
    assert got[0][0] == 0 and got[-1][1] == total
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(got))
    assert len(got) <= PIECES_MAX and len(got) >= min(connections, total)
    # big enough that a request per piece costs nothing, unless the file is small
    assert min(e - s for s, e in got[:-1] or got) >= min(PIECE_MIN, total // connections)


def test_pieces_are_handed_out_in_file_order_one_per_free_connection(tmp_path: Path) -> None:
    file = ranged(tmp_path, parts=2, total=5 * PIECE_MIN)
    assert len(file.parts) == 5
    first = file.hand_out()
    assert first == file.parts[:2] and file.hand_out() == []
    first[0].complete, file.taken = True, file.taken - 1
    assert file.hand_out() == [file.parts[2]]
    file.spool.discard()


def ranged(tmp_path: Path, parts: int = 3, stated: dict[str, bytes] | None = None,
           total: int = TOTAL) -> RangedFile:
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    spool = FileSpool(dir_fd, "spool", str(tmp_path))
    plan = SplitPlan(total, '"v1"', stated if stated is not None else {})
    return RangedFile((None, "big.bin", "http://x/big.bin", 1), spool, plan, parts)


def answer(part: Part, content_range: str | None = None, status: int = 206) -> None:
    part.reset()
    rng = content_range or f"bytes {part.start}-{part.end - 1}/{TOTAL}"
    part.lines = lines(f"Content-Range: {rng}", status=f"HTTP/1.1 {status} X")


def feed(part: Part, data: bytes) -> list[int | None]:
    return [part.write(data[at : at + 65536]) for at in range(0, len(data), 65536)]


def test_parts_written_out_of_order_hash_to_the_whole_file(tmp_path: Path) -> None:
    stated = {"md5": hashlib.md5(BODY).digest(), "sha256": hashlib.sha256(BODY).digest()}
    file = ranged(tmp_path, stated=stated)
    assert [p.headers() for p in file.parts][1] == [
        f"Range: bytes={file.parts[1].start}-{file.parts[1].end - 1}", 'If-Range: "v1"']
    for part in reversed(file.parts):
        answer(part)
        assert set(feed(part, BODY[part.start : part.end])) == {None}
        assert part.problem == "" and part.written == part.end - part.start
    # the first piece is where hashing stands: hashed as it came; the others wait
    assert file.hash_submitted == file.parts[0].end == file.hashable_end()
    for part in file.parts:
        part.complete = True
    assert file.hashable_end() == TOTAL and file.written == TOTAL
    file.hash_region(file.hash_submitted, 200_000)  # read back, as the hashing thread does
    file.hash_region(200_000, TOTAL)
    assert file.md5.digest() == hashlib.md5(BODY).digest()
    assert file.mismatch() is None
    assert (tmp_path / "spool").read_bytes() == BODY
    file.spool.discard()


def test_a_file_whose_ranges_hash_wrong_is_caught_and_one_with_no_digest_is_size_only(
        tmp_path: Path) -> None:
    wrong = ranged(tmp_path, stated={"sha256": hashlib.sha256(b"other").digest()})
    for part in wrong.parts:
        answer(part)
        feed(part, BODY[part.start : part.end])
    wrong.hash_region(wrong.hash_submitted, TOTAL)
    assert wrong.mismatch() == (
        "SHA256 of the file's ranges does not match the server's Repr-Digest")
    wrong.spool.discard()
    assert ranged(tmp_path / ".." / tmp_path.name).checked_by_size_only


@pytest.mark.parametrize(("status", "content_range", "problem"), [
    (200, None, "the server answered a range with the whole file (200)"),
    (206, f"bytes 1-100/{TOTAL}", "the server sent Content-Range 'bytes 1-100/"),
    (206, "bytes 0-99999/999", "the server sent Content-Range"),
])
def test_an_answer_that_is_not_the_range_asked_is_never_written(
        tmp_path: Path, status: int, content_range: str | None, problem: str) -> None:
    file = ranged(tmp_path)
    part = file.parts[0]
    answer(part, content_range, status)
    assert part.write(BODY[:1000]) == 0
    assert part.problem.startswith(problem)
    assert (tmp_path / "spool").read_bytes() == b""
    file.spool.discard()


def test_more_bytes_than_the_range_stop_the_part_and_an_error_status_is_judged_later(
        tmp_path: Path) -> None:
    file = ranged(tmp_path)
    part = file.parts[0]
    answer(part)
    feed(part, BODY[: part.end - part.start])
    assert part.write(b"x") == 0 and "more than the" in part.problem
    other = file.parts[1]
    answer(other, status=503)
    assert other.write(b"busy") == 0 and other.problem == "" and other.status == 503
    file.spool.discard()


def test_digests_in_a_plan_come_from_repr_digest_too() -> None:
    sha = hashlib.sha256(BODY).digest()
    plan = split_plan(lines(*SPLITTABLE,
                            f"Repr-Digest: sha-256=:{base64.b64encode(sha).decode()}:"))
    assert plan is not None and plan.stated == {"sha256": sha}


def test_a_part_that_broke_off_asks_for_the_rest_only(tmp_path: Path) -> None:
    file = ranged(tmp_path, parts=2)
    part = file.parts[1]
    answer(part)
    assert part.headers()[0] == f"Range: bytes={part.start}-{part.end - 1}"
    half = (part.end - part.start) // 2
    feed(part, BODY[part.start : part.start + half])
    assert file.hashable_end() == 0  # part 0 has nothing yet
    part.reset()  # the connection broke: the next attempt
    rest = f"bytes {part.start + half}-{part.end - 1}/{TOTAL}"
    assert part.headers()[0] == f"Range: {rest.replace(' ', '=').replace('/' + str(TOTAL), '')}"
    part.lines = lines(f"Content-Range: {rest}", status="HTTP/1.1 206 Partial Content")
    assert set(feed(part, BODY[part.start + half : part.end])) == {None}
    assert part.written == part.end - part.start
    first = file.parts[0]
    answer(first)
    feed(first, BODY[: first.end])
    assert (tmp_path / "spool").read_bytes() == BODY
    file.spool.discard()


def test_pieces_written_in_order_are_hashed_in_line_without_reading_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = ranged(tmp_path, stated={"sha256": hashlib.sha256(BODY).digest()})
    def read_back(self: RangedFile, start: int, end: int) -> None:
        raise AssertionError(f"read back bytes {start}-{end}")

    monkeypatch.setattr(RangedFile, "hash_region", read_back)
    for part in file.parts:
        answer(part)
        feed(part, BODY[part.start : part.end])
    assert file.hash_submitted == TOTAL
    assert file.md5.digest() == hashlib.md5(BODY).digest() and file.mismatch() is None
    file.spool.discard()


def test_the_next_piece_catches_up_in_line_when_little_is_behind(tmp_path: Path) -> None:
    file = ranged(tmp_path, parts=2)
    first, second = file.parts[0], file.parts[1]
    answer(second)
    second.write(BODY[second.start : second.start + 1000])  # ahead of hashing: not hashed
    assert file.hash_submitted == 0
    answer(first)
    feed(first, BODY[: first.end])
    assert file.hash_submitted == first.end
    second.write(BODY[second.start + 1000 : second.start + 2000])  # reads 1000 back
    assert file.hash_submitted == second.start + 2000
    busy: Future[None] = Future()  # the hashing thread has a job: hashing waits for it
    file.hash_job = busy
    second.write(BODY[second.start + 2000 : second.start + 3000])
    assert file.hash_submitted == second.start + 2000
    busy.set_result(None)
    assert CATCH_UP_MAX >= 1000
    feed(second, BODY[second.start + second.written : second.end])
    assert file.hash_submitted == TOTAL and file.md5.digest() == hashlib.md5(BODY).digest()
    file.spool.discard()


def test_a_record_claims_written_bytes_only_in_the_boot_that_wrote_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    written = ((0, 10, 10), (10, 20, 4))
    durable = ((0, 10, 6), (10, 20, 0))
    record = resume.PartialRecord("a", 20, '"v"', written, (), "boot-1", durable)
    again = resume.PartialRecord.decode(record.encode())
    assert again == record
    monkeypatch.setattr(resume, "BOOT_ID", "boot-1")  # a killed process: its bytes are there
    assert again.for_this_boot().parts == written
    monkeypatch.setattr(resume, "BOOT_ID", "boot-2")  # the machine restarted: fsynced only
    assert again.for_this_boot().parts == durable and again.for_this_boot().written == 6
    fsynced = resume.PartialRecord("a", 20, '"v"', written)  # durable: good in any boot
    assert resume.PartialRecord.decode(fsynced.encode()).for_this_boot().parts == written
    bad = record.encode().replace(b'"durable": [[0, 10, 6]', b'"durable": [[0, 10, 11]')
    assert resume.PartialRecord.decode(bad) is None


def test_a_resumed_file_has_exactly_the_pieces_its_record_left(tmp_path: Path) -> None:
    layout = ((0, 100_000, 100_000), (100_000, 200_000, 5), (200_000, TOTAL, 0))
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    spool = FileSpool(dir_fd, "spool", str(tmp_path))
    file = RangedFile.resumed((None, "big.bin", "u", 1), spool, SplitPlan(TOTAL, '"v"', {}), 8,
                              layout)
    assert file.layout() == layout and file.done == 1 and file.written == 100_005
    assert file.hand_out() == file.parts[1:]  # the complete one is not asked again
    assert file.parts[1].headers()[0] == "Range: bytes=100005-199999"
    spool.discard()


def test_with_a_core_to_spare_nothing_is_hashed_in_line(tmp_path: Path) -> None:
    file = ranged(tmp_path)
    file.in_line = False  # the hashing thread takes it all (BigFiles.poll hands it over)
    for part in file.parts:
        answer(part)
        feed(part, BODY[part.start : part.end])
        part.complete = True
    assert file.hash_submitted == 0 and file.hashable_end() == TOTAL
    file.hash_region(0, TOTAL)
    assert file.md5.digest() == hashlib.md5(BODY).digest()
    file.spool.discard()


def test_a_partial_file_holds_a_record_by_the_bytes_written_not_the_pieces_ahead() -> None:
    # pieces in file order: the last ones not started begin beyond the file's end
    record = resume.PartialRecord("a", 40, '"v"', ((0, 10, 10), (10, 20, 5), (20, 40, 0)))
    assert record.held_by(15) and not record.held_by(14)
    assert resume.PartialRecord("a", 40, '"v"', ((0, 40, 0),)).held_by(0)
