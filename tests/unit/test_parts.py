"""Ranges of a big file on their own: when a file may be split, how, what a part trusts of
an answer, and the in-order hash of the parts written by offset into one spool file."""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
from pathlib import Path

import pytest

from bulkfetch.engine.parts import Part, RangedFile, SplitPlan, ranges, split_plan
from bulkfetch.sinks.spool import FileSpool

TOTAL = 300_001
BODY = os.urandom(TOTAL)


def lines(*headers: str, status: str = "HTTP/1.1 200 OK") -> list[bytes]:
    return [f"{status}\r\n".encode(), *(f"{h}\r\n".encode() for h in headers), b"\r\n"]


SPLITTABLE = ("Content-Length: 1000", "Accept-Ranges: bytes", 'ETag: "abc"')


def test_a_file_goes_by_ranges_only_when_the_server_makes_it_safe() -> None:
    plan = split_plan(lines(*SPLITTABLE))
    assert plan == SplitPlan(1000, '"abc"', {})
    assert split_plan(lines(*SPLITTABLE[:2])) is None  # no validator
    assert split_plan(lines(SPLITTABLE[0], SPLITTABLE[2])) is None  # no ranges
    assert split_plan(lines(*SPLITTABLE[1:])) is None  # no length
    assert split_plan(lines(*SPLITTABLE, status="HTTP/1.1 404 Not Found")) is None
    weak = split_plan(lines(*SPLITTABLE[:2], 'ETag: W/"abc"',
                            "Last-Modified: Wed, 01 Jan 2025 00:00:00 GMT"))
    assert weak is not None and weak.validator == "Wed, 01 Jan 2025 00:00:00 GMT"


@pytest.mark.parametrize(("total", "parts"), [(10, 3), (8, 8), (1_000_001, 8), (7, 2)])
def test_ranges_cover_the_file_once_in_near_equal_parts(total: int, parts: int) -> None:
    got = ranges(total, parts)
    assert len(got) == parts and got[0][0] == 0 and got[-1][1] == total
    assert all(a[1] == b[0] for a, b in itertools.pairwise(got))
    assert max(e - s for s, e in got) - min(e - s for s, e in got) <= 1


def ranged(tmp_path: Path, parts: int = 3, stated: dict[str, bytes] | None = None) -> RangedFile:
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    spool = FileSpool(dir_fd, "spool", str(tmp_path))
    plan = SplitPlan(TOTAL, '"v1"', stated if stated is not None else {})
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
    # parts write in order within themselves: the first one's bytes are hashable already
    assert file.hashable_end() == file.parts[0].end
    for part in file.parts:
        part.complete = True
    assert file.hashable_end() == TOTAL and file.written == TOTAL
    file.hash_region(0, 1000)
    file.hash_region(1000, TOTAL)
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
    wrong.hash_region(0, TOTAL)
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
