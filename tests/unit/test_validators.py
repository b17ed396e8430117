"""dest/validators.py: the ETag and Last-Modified kept beside a file's sums line, read back
with it (dest/sums.py), carried through a rewrite, and the requests they make."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from bulkfetch.dest.sums import KEPT_TABLE, SUMS_DIR, load_latest, rewrite
from bulkfetch.dest.validators import (
    conditional_headers,
    http_validators,
    validator_lines,
)
from bulkfetch.util.checksum_lines import sum_lines

STATUS = b"HTTP/1.1 200 OK\r\n"
NGINX = [STATUS, b"Server: nginx/1.22.1\r\n",
         b"Last-Modified: Sun, 29 Nov 2026 04:00:00 GMT\r\n", b"Content-Length: 3\r\n",
         b'ETag: "692a7f30-3"\r\n', b"Accept-Ranges: bytes\r\n", b"\r\n"]


def test_a_200s_validators_are_read_as_sent() -> None:
    assert http_validators(NGINX) == ('"692a7f30-3"', "")  # the ETag alone is enough
    lower = [line.lower() if line.startswith(b"ETag") else line for line in NGINX]
    assert http_validators(lower)[0] == '"692a7f30-3"'  # a header's name has no case
    weak = [STATUS, b'etag: W/"abc"\r\n']
    assert http_validators(weak) == ('W/"abc"', "")
    only_date = [STATUS, b"Last-Modified: Mon, 30 Nov 2026 01:02:03 GMT\r\n"]
    assert http_validators(only_date) == ("", "Mon, 30 Nov 2026 01:02:03 GMT")
    later = [*NGINX, b'ETag: "second"\r\n']
    assert http_validators(later)[0] == '"second"'  # the last one wins
    # a redirect's own headers are not the file's
    chain = [b"HTTP/1.1 301 Moved\r\n", b'ETag: "hop"\r\n', b"Location: /x\r\n", b"\r\n",
             b"HTTP/1.1 200 OK\r\n", b"Last-Modified: Mon, 30 Nov 2026 01:02:03 GMT\r\n"]
    assert http_validators(chain) == ("", "Mon, 30 Nov 2026 01:02:03 GMT")


@pytest.mark.parametrize("lines", [
    [STATUS],
    [STATUS, b"Content-Length: 3\r\n"],
    [STATUS, b'ETag: "with space"\r\n'],  # not an entity tag
    [STATUS, b"ETag: unquoted\r\n"],
    [STATUS, b"Last-Modified: odd_date\r\n"],  # `_` is the stored form's space
    [STATUS, b'ETag: "' + b"x" * 600 + b'"\r\n'],
    [STATUS, b'ETag: "caf\xe9"\r\n'],  # obs-text: allowed, and never seen
], ids=["none", "neither", "space", "unquoted", "underscore", "long", "not-ascii"])
def test_what_is_no_validator_is_not_kept(lines: list[bytes]) -> None:
    assert http_validators(lines) is None


def test_the_request_asks_the_way_the_server_answered() -> None:
    md5 = "0" * 32
    assert conditional_headers(md5, "", "") == f'If-None-Match: "{md5}"'
    assert conditional_headers(md5, '"e-3"', "") == 'If-None-Match: "e-3"'
    # a date alone goes alone: beside If-None-Match a server must ignore it
    assert conditional_headers(md5, "", "Sun, 29 Nov 2026 04:00:00 GMT") == \
        "If-Modified-Since: Sun, 29 Nov 2026 04:00:00 GMT"
    assert conditional_headers(md5, '"e-3"', "Sun, 29 Nov 2026 04:00:00 GMT") == \
        'If-None-Match: "e-3"'  # (never kept together: the ETag wins)


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute(KEPT_TABLE)
    return db


def _write(dest: Path, stem: str, sums: list[tuple[str, str]],
           validators: list[tuple[str, str, str]] | None, at: float) -> None:
    where = dest / SUMS_DIR
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{stem}.md5").write_bytes(sum_lines(sums))
    if validators is not None:
        (where / f"{stem}.http").write_bytes(validator_lines(validators))
    os.utime(where / f"{stem}.md5", (at, at))


def _validators(db: sqlite3.Connection) -> dict[str, tuple[str, str]]:
    return {path: (etag, modified) for path, etag, modified in db.execute(
        "SELECT v.path, v.etag, v.modified FROM validators v JOIN kept k "
        "ON k.path = v.path AND k.written = v.written")}


ODD = "a dir/new\nline \\ back.bin"  # escaped in both files


def test_validators_hold_only_beside_their_sums_line(tmp_path: Path) -> None:
    dest = tmp_path
    date = "Sun, 29 Nov 2026 04:00:00 GMT"
    _write(dest, "w0-1", [("a" * 32, "x.bin"), ("b" * 32, ODD), ("c" * 32, "y.bin")],
           [("x.bin", '"e-1"', date), (ODD, "", date), ("y.bin", 'W/"w"', "")],
           time.time() - 100)
    # y.bin fetched again later from a server whose ETag is its MD5: no validators line
    _write(dest, "w0-2", [("d" * 32, "y.bin")], None, time.time())
    db = _db()
    loaded = load_latest(db, dest)
    assert loaded.improper == 0
    assert _validators(db) == {"x.bin": ('"e-1"', date), ODD: ("", date)}

    # a rewrite carries them (and drops the removed), and removes the old companions
    db.execute("CREATE TABLE removed (path TEXT PRIMARY KEY)")
    db.execute("INSERT INTO removed VALUES ('x.bin')")
    compacted = rewrite(db, dest, exclude="removed")
    assert sorted(p.name for p in (dest / SUMS_DIR).iterdir()) == \
        sorted([compacted.name, compacted.with_suffix(".http").name])
    again = _db()
    load_latest(again, dest)
    assert _validators(again) == {ODD: ("", date)}
    assert dict(again.execute("SELECT path, md5 FROM kept")) == {ODD: "b" * 32,
                                                                "y.bin": "d" * 32}


def test_a_damaged_companion_line_is_counted_not_taken(tmp_path: Path) -> None:
    _write(tmp_path, "w0-1", [("a" * 32, "x.bin")], [("x.bin", '"e"', "")], time.time())
    companion = tmp_path / SUMS_DIR / "w0-1.http"
    companion.write_bytes(companion.read_bytes() + b"garbage\n\\bad -  x\\q\n")
    db = _db()
    assert load_latest(db, tmp_path).improper == 2
    assert _validators(db) == {"x.bin": ('"e"', "")}
