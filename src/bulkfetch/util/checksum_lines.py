"""Checksum lines as coreutils' `md5sum`/`sha1sum`/`sha256sum` and `b3sum` write and read them.

Output is byte for byte what coreutils 9 writes in text mode: `<hex>  <path>\\n`. A path
holding a backslash, a newline or a carriage return cannot be written as is (the line would
be ambiguous), so the line starts with a backslash and those characters are written `\\\\`,
`\\n`, `\\r`. b3sum escapes only the backslash and the newline, and its `--check` refuses
`\\r`, so BLAKE3 lines follow b3sum there. `md5sum -c` prints `<path>: OK`, and escapes
the path (the same three characters, with a leading backslash) only when it holds a newline.

Reading (`--check`) accepts what either tool writes, as `md5sum -c` does: the `*` binary
marker, a single space or a tab after the digest, upper-case hex, `\\r\\n` line ends, the
backslash-escaped form, BSD tags (`MD5 (path) = <hex>`), and it skips empty lines and `#`
comments. Paths stay bytes until they are decoded with os.fsdecode, so a name that is not
UTF-8 goes through a check unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from bulkfetch.errors import UsageError

__all__ = [
    "ALGORITHMS",
    "HEX_LENGTHS",
    "CheckEntry",
    "ChecksumReader",
    "check_line",
    "check_warnings",
    "parse_line",
    "sum_line",
    "sum_lines",
]

ALGORITHMS = ("md5", "sha1", "sha256", "blake3")
HEX_LENGTHS = {"md5": 32, "sha1": 40, "sha256": 64, "blake3": 64}
# A digest length without --algo: 64 hex digits are SHA-256, as sha256sum would read them.
_BY_LENGTH = {32: "md5", 40: "sha1", 64: "sha256"}
_TAGS = {b"MD5": "md5", b"SHA1": "sha1", b"SHA256": "sha256", b"BLAKE3": "blake3"}
LINE_LIMIT = 1 << 16  # longer lines cannot be a path (PATH_MAX 4096, escaped twice) plus hex

_ESCAPED = {"\\": b"\\\\", "\n": b"\\n", "\r": b"\\r"}
_NEEDS_ESCAPE = re.compile(rb"[\\\n\r]").search
_NEEDS_ESCAPE_B3 = re.compile(rb"[\\\n]").search
_ESCAPE = re.compile(rb"[\\\n\r]")
_ESCAPE_B3 = re.compile(rb"[\\\n]")
_UNESCAPE = re.compile(rb"\\(.?)", re.S)
_UNESCAPED = {b"\\": b"\\", b"n": b"\n", b"r": b"\r"}
# "MD5 (path) = hex": the spaces around "=" and before "(" are optional, as for md5sum -c.
_TAGGED = re.compile(rb"([A-Z0-9]+) ?\((.*)\) ?= ?([0-9A-Fa-f]+)", re.S)
# hex, one blank, an optional mode marker (' ' text, '*' binary), then the path (not empty).
_UNTAGGED = re.compile(rb"([0-9A-Fa-f]+)[ \t]([ *]?)(.+)", re.S)


def _escape(name: bytes, pattern: re.Pattern[bytes]) -> bytes:
    return pattern.sub(lambda m: _ESCAPED[m.group().decode()], name)


def sum_line(hexdigest: str, path: str, algo: str = "md5") -> bytes:
    """The line `md5sum` (`b3sum` for blake3) writes for `path`, newline included."""
    name = os.fsencode(path)
    search, pattern = ((_NEEDS_ESCAPE_B3, _ESCAPE_B3) if algo == "blake3"
                       else (_NEEDS_ESCAPE, _ESCAPE))
    if search(name) is None:
        return b"%s  %s\n" % (hexdigest.encode(), name)
    return b"\\%s  %s\n" % (hexdigest.encode(), _escape(name, pattern))


def escaped_name(name: bytes) -> tuple[bytes, bool]:
    """`name` as a checksum line holds it, and whether it needed md5sum's escaping (the
    line then starts with a backslash)."""
    if _NEEDS_ESCAPE(name) is None:
        return name, False
    return _escape(name, _ESCAPE), True


def unescaped_name(name: bytes) -> bytes | None:
    """The name of an escaped line; None when it holds an escape md5sum never writes."""
    return _unescape(name)


def sum_lines(entries: list[tuple[str, str]]) -> bytes:
    """sum_line() of each (MD5 hex, path), joined; one encode and three scans when no path
    needs escaping (the usual case: the directory sink writes a page of them at a time)."""
    data = os.fsencode("".join([f"{digest}  {path}\n" for digest, path in entries]))
    if data.count(b"\n") == len(entries) and b"\\" not in data and b"\r" not in data:
        return data
    return b"".join([sum_line(digest, path) for digest, path in entries])


def check_line(path: str, status: str) -> bytes:
    """`md5sum -c`'s line for `path`: `path: OK`, `path: FAILED`, `path: FAILED open or read`."""
    name = os.fsencode(path)
    if b"\n" in name:
        return b"\\%s: %s\n" % (_escape(name, _ESCAPE), status.encode())
    return b"%s: %s\n" % (name, status.encode())


def check_warnings(improper: int, unreadable: int, mismatched: int) -> list[str]:
    """md5sum -c's closing warnings, in its order, for the counts that are not zero."""
    lines = []
    if improper:
        lines.append(f"WARNING: {improper:,} line{' is' if improper == 1 else 's are'} "
                     "improperly formatted")
    if unreadable:
        lines.append(f"WARNING: {unreadable:,} listed file{'s' * (unreadable != 1)} could "
                     "not be read")
    if mismatched:
        lines.append(f"WARNING: {mismatched:,} computed checksum{'s' * (mismatched != 1)} "
                     "did NOT match")
    return lines


class CheckEntry(NamedTuple):
    path: str  # os.fsdecode of the listed bytes
    expected: str  # lower-case hex


class _Parsed(NamedTuple):
    algo: str | None  # from a BSD tag; None for the untagged form
    hexdigest: str
    name: bytes


def _unescape(name: bytes) -> bytes | None:
    """`\\\\`, `\\n` and `\\r` decoded; None for any other escape (not a checksum line)."""
    bad = False

    def one(match: re.Match[bytes]) -> bytes:
        nonlocal bad
        decoded = _UNESCAPED.get(match.group(1))
        if decoded is None:
            bad = True
            return b""
        return decoded

    result = _UNESCAPE.sub(one, name)
    return None if bad else result


def parse_line(line: bytes) -> _Parsed | None:
    """One checksum line without its newline -> (tag algorithm or None, hex, path bytes), or
    None when it is not a checksum line in any form md5sum -c or b3sum --check reads."""
    if line.endswith(b"\r"):
        line = line[:-1]
    line = line.lstrip(b" \t")
    escaped = line.startswith(b"\\")
    if escaped:
        line = line[1:]
    algo = None
    match = _TAGGED.fullmatch(line)
    if match is not None and match.group(1) in _TAGS:
        algo = _TAGS[match.group(1)]
        hexdigest, name = match.group(3), match.group(2)
    else:
        match = _UNTAGGED.fullmatch(line)
        if match is None:
            return None
        hexdigest, name = match.group(1), match.group(3)
    if len(hexdigest) not in _BY_LENGTH or not name or b"\0" in name:
        return None
    if escaped:
        unescaped = _unescape(name)
        if unescaped is None:
            return None
        name = unescaped
    return _Parsed(algo, hexdigest.decode().lower(), name)


class ChecksumReader:
    """The entries of a checksum file, streamed line by line (memory does not grow with it).

    The algorithm is `algo` when given; otherwise the first checksum line sets it (its BSD tag,
    else its length: 32 hex digits md5, 40 sha1, 64 sha256), and the lines after it must
    agree. A line that is not a checksum line of that algorithm counts in `improper`, as
    md5sum -c counts it; empty lines and `#` comments are skipped.
    """

    def __init__(self, stream: BinaryIO, algo: str | None = None) -> None:
        if algo is not None and algo not in HEX_LENGTHS:
            raise UsageError(f"unknown algorithm {algo!r}: use one of {', '.join(ALGORITHMS)}")
        self._stream = stream
        self.algo = algo
        self.improper = 0
        self.entries = 0

    def __iter__(self) -> Iterator[CheckEntry]:
        for line in self._lines():
            if not line or line.startswith(b"#"):
                continue
            parsed = parse_line(line)
            if parsed is None or not self._agrees(parsed):
                self.improper += 1
                continue
            self.entries += 1
            yield CheckEntry(os.fsdecode(parsed.name), parsed.hexdigest)

    def _agrees(self, parsed: _Parsed) -> bool:
        """Whether `parsed` is a line of this file's algorithm (fixing it at the first line)."""
        if self.algo is None:
            self.algo = parsed.algo or _BY_LENGTH[len(parsed.hexdigest)]
        if parsed.algo is not None and parsed.algo != self.algo:
            return False
        return len(parsed.hexdigest) == HEX_LENGTHS[self.algo]

    def _lines(self) -> Iterator[bytes]:
        """Lines without their newline; an overlong line comes out as b"\\0" (improper)."""
        readline = self._stream.readline
        while line := readline(LINE_LIMIT):
            if line.endswith(b"\n"):
                yield line[:-1]
            elif len(line) < LINE_LIMIT:
                yield line  # the last line, without a newline
            else:
                while (rest := readline(LINE_LIMIT)) and not rest.endswith(b"\n"):
                    pass
                yield b"\0"
