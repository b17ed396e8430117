"""A file's HTTP validators, kept beside its MD5 so that `get --sync` asks any server the
way that server understands.

Where a server's ETag is the body's MD5 (S3, most object stores, the reference server) the
sums line is the validator: a sync asks `If-None-Match: "<MD5>"`. Every other server (stock
nginx's "mtime-size", Apache's inode-size-mtime, a CDN's opaque tag, python -m http.server
with no ETag at all) would answer such a request 200 with the whole body again. So for a body
whose ETag was not its MD5 the directory sink keeps the ETag as the server sent it (or, when
it sent none, its Last-Modified), in a companion of its sums file (`<worker>.http` beside
`<worker>.md5`), a line per file:

    ETAG LAST-MODIFIED  PATH

- ETAG as sent (quotes and any W/ included), `-` when there was none;
- LAST-MODIFIED as sent with its spaces as `_` (an HTTP date has no `_`), `-` when none;
- PATH as in the sums line (md5sum's escaping, the line then starting with a backslash).

A validators line holds only with the sums line it was written beside: the loader joins them
by the sums file's modification time (`written`), so a later sums line of the same path (the
file fetched again from a server whose ETag is its MD5) leaves an older validators line out.
A server that sent neither header, or an ETag with a space in it (not a valid entity tag),
leaves no line: its file is asked for by MD5 as before.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from bulkfetch.util.checksum_lines import escaped_name, unescaped_name

__all__ = ["COMPANION", "VALIDATORS_TABLE", "conditional_headers", "http_validators",
           "load_companion", "validator_lines", "write_companion"]

COMPANION = ".http"  # the suffix replacing a sums file's ".md5"
VALIDATORS_TABLE = ("CREATE TABLE IF NOT EXISTS validators (path TEXT PRIMARY KEY, "
                    "etag TEXT NOT NULL, modified TEXT NOT NULL, written INTEGER NOT NULL) "
                    "WITHOUT ROWID")
_LONGEST = 512  # a longer ETag or date is no validator worth keeping a line per file for


def http_validators(lines: list[bytes], lowered: bytes | None = None
                    ) -> tuple[str, str] | None:
    """(ETag, "") of a 200's raw header lines, or ("", Last-Modified) when it sent no
    usable ETag (the last of each wins, of the last response: libcurl's lines of a redirect
    chain hold every hop's); None when neither is a usable validator. An ETag alone asks
    as well as both (nginx, which wants both to match when both are asked, tests only the
    one asked), and a date beside it would cost every file a second search and a longer
    line. `lowered`: the lines joined and lower-cased,
    when the caller has them (the fetcher does, for every body whose ETag is not its MD5).
    Found in the joined block by C-level searches: a loop over the lines in Python cost
    6.3 µs a file, an eighth of a small file's whole cost from stock nginx (2026-11-29)."""
    raw = b"".join(lines)
    if lowered is None:
        lowered = raw.lower()
    start = lowered.rfind(b"\nhttp/") + 1  # the last response's status line (0: the first)
    etag = _value(raw, lowered, b"\netag:", start)
    if etag.startswith((b'"', b'W/"')) and b" " not in etag and len(etag) <= _LONGEST \
            and etag.isascii():
        return etag.decode("latin-1"), ""  # (an ETag is enough: the date is not kept)
    modified = _value(raw, lowered, b"\nlast-modified:", start)
    if not modified or b"_" in modified or len(modified) > _LONGEST or not modified.isascii():
        return None
    return "", modified.decode("latin-1")


def kept_validator(validator: str) -> tuple[str, str] | None:
    """http_validators() of the one validator a file fetched in ranges was asked with in
    If-Range (a strong ETag, else a Last-Modified date)."""
    name = b"etag" if validator.startswith('"') else b"last-modified"
    return http_validators([b"HTTP/1.1 200 OK\r\n",
                            name + b": " + validator.encode("latin-1", "replace") + b"\r\n"])


def _value(raw: bytes, lowered: bytes, name: bytes, start: int) -> bytes:
    """The value of the last header `name` ("\\nname:") at or after `start`, b"" if none."""
    at = lowered.rfind(name, start)  # (a header line follows the status line: "\n" first)
    if at < 0:
        return b""
    at += len(name)
    end = lowered.find(b"\n", at)
    return raw[at:end if end >= 0 else len(raw)].strip()


def conditional_headers(md5: str, etag: str, modified: str) -> str:
    """The request header line asking for a file DEST holds with `md5`, stored with the
    server's `etag` or, when it sent none, its `modified` ("" when neither was kept): a date
    goes alone, as a server must ignore If-Modified-Since beside If-None-Match (RFC 9110,
    13.1.3; python -m http.server does)."""
    if etag:
        return f"If-None-Match: {etag}"
    if modified:
        return f"If-Modified-Since: {modified}"
    return f'If-None-Match: "{md5}"'


def validator_lines(entries: list[tuple[str, str, str]]) -> bytes:
    """The companion's lines of (path, ETag, Last-Modified) entries; one encode and a scan
    or two when no path needs escaping (the usual case: a page of them at a time)."""
    data = "".join([f"{etag or '-'} {modified.replace(' ', '_') or '-'}  {path}\n"
                    for path, etag, modified in entries]).encode("utf-8", "surrogateescape")
    if data.count(b"\n") == len(entries) and b"\\" not in data and b"\r" not in data:
        return data
    out = []
    for path, etag, modified in entries:
        name, escaped = escaped_name(os.fsencode(path))
        head = b"\\" if escaped else b""
        out.append(b"%s%s %s  %s\n" % (head, etag.encode("latin-1") or b"-",
                                       modified.replace(" ", "_").encode("latin-1") or b"-",
                                       name))
    return b"".join(out)


def _parse(line: bytes) -> tuple[str, str, str] | None:
    escaped = line.startswith(b"\\")
    if escaped:
        line = line[1:]
    etag, space, rest = line.partition(b" ")
    modified, gap, name = rest.partition(b"  ")
    if not space or not gap or not name or not etag or not modified:
        return None
    if escaped:
        decoded = unescaped_name(name)
        if decoded is None:
            return None
        name = decoded
    return (os.fsdecode(name), "" if etag == b"-" else etag.decode("latin-1"),
            "" if modified == b"-" else modified.replace(b"_", b" ").decode("latin-1"))


def companion_of(sums_file: Path) -> Path:
    return sums_file.with_suffix(COMPANION)


def load_companion(db: sqlite3.Connection, sums_file: Path, written: int) -> int:
    """Add the validators lines beside `sums_file` (whose lines were `written` then) to
    `db`'s table `validators`; the number of lines that were not validators lines."""
    try:
        data = companion_of(sums_file).read_bytes()
    except FileNotFoundError:
        return 0
    rows, improper = [], 0
    for line in data.splitlines():
        parsed = _parse(line)
        if parsed is None:
            improper += 1
        else:
            rows.append((*parsed, written))
    db.executemany("INSERT OR REPLACE INTO validators (path, etag, modified, written) "
                   "VALUES (?, ?, ?, ?)", rows)
    return improper


def write_companion(db: sqlite3.Connection, sums_file: Path, exclude: str | None) -> None:
    """Write the companion of the compacted `sums_file` (not yet in place) from the
    validators that held with their sums lines (`kept`), less the paths in table `exclude`
    (none: no companion); raises OSError."""
    where = f" AND v.path NOT IN (SELECT path FROM {exclude})" if exclude else ""
    rows = db.execute("SELECT v.path, v.etag, v.modified FROM validators v JOIN kept k "
                      f"ON k.path = v.path AND k.written = v.written{where} ORDER BY v.path")
    batch = rows.fetchmany(10_000)
    if not batch:
        return
    with open(companion_of(sums_file), "wb") as out:
        while batch:
            out.write(validator_lines(batch))
            batch = rows.fetchmany(10_000)
        out.flush()
        os.fsync(out.fileno())
