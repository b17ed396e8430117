"""Overlays that make a data set hostile: attack names in listings, broken pagination, and
a first list page far larger than the page size.

Both are deterministic, so a test can name exactly what it expects a client to reject.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

from bulkfetch.server.dataset import BytesEntry, DataSet, Entry, SyntheticDataSet

# RELIABILITY.md items 1-3. Each is listed once on the first page, after the good names.
TRAVERSAL_NAMES = (
    "../x",
    "a/../../x",
    "..",
    "p/..",
    "/etc/x",
    "~/x",
    "C:x",
    "\\\\srv\\s",
    "..\\x",
)
MALFORMED_NAMES = (
    "nul\x00byte",
    "ctl\x01\x1b[31mred",
    "bad-utf8-\udcff",  # a lone surrogate: valid JSON escape, not encodable as UTF-8
    "",
    "long-" + "x" * 300,  # one component past NAME_MAX (255 bytes)
    "/".join(["deep-" + "y" * 200] * 25),  # whole path past PATH_MAX (4096 bytes)
    "trailing-dot.",
    "trailing-space ",
)
# Collisions: "h/x" vs "h/x/y" (a file where a directory must go), NFC vs NFD spellings of
# one name, and full-width dots that some tools normalise to "..".
COLLISION_NAMES = (
    "h/x",
    "h/x/y",
    "caf\u00e9",
    "cafe\u0301",
    "\uff0e\uff0e/fullwidth",
)
DUPLICATE_OF_INDEX = 1  # the good name of file 1 is listed a second time


def hostile_body(name: str, salt: str = "") -> bytes:
    """100 bytes for an attack name; --etag-salt S appends "/S" to the hashed text."""
    text = "bulkfetch/hostile/" + name + (f"/{salt}" if salt else "")
    return hashlib.shake_128(text.encode("utf-8", "surrogatepass")).digest(100)


class HostileNames:
    """Appends the attack names (and one duplicate of a good name) to the first page."""

    def __init__(self, inner: SyntheticDataSet) -> None:
        self.inner = inner
        self.page_size = inner.page_size
        self.identity = inner.identity + "/hostile"
        self.extra = [*TRAVERSAL_NAMES, *MALFORMED_NAMES, *COLLISION_NAMES]
        if inner.files > DUPLICATE_OF_INDEX:
            self.extra.append(inner.name(DUPLICATE_OF_INDEX))
        self.total: int | None = inner.files + len(self.extra)
        self._bodies = {n: hostile_body(n, inner.salt) for n in self.extra
                        if inner.index_of(n) is None}

    def page(self, cursor: bytes | None) -> tuple[list[str], bytes | None]:
        names, following = self.inner.page(cursor)
        if cursor is None:
            names = names + self.extra
        return names, following

    def lookup(self, name: str) -> Entry | None:
        body = self._bodies.get(name)
        if body is not None:
            return BytesEntry(body, self.inner.last_modified)
        return self.inner.lookup(name)


BAD_PAGE_KINDS = ("empty", "repeat", "content-type", "malformed", "loop")


@dataclass(frozen=True)
class PageAnswer:
    names: list[str]
    next_cursor: bytes | None
    content_type: str = "application/json"
    malformed: bool = False
    huge: bool = False  # HugeFirstPage's first page: names left out, streamed by first_page()


class BadPages:
    """Broken pagination on a synthetic listing, at fixed places:

    - empty: page 0 points to an extra empty page that still has a NextMarker (to page 1);
    - repeat: page 1 is served a second time under a new token, then listing goes on;
    - content-type: page 2 is valid JSON labelled text/html;
    - malformed: page 3 is cut off mid-JSON (status 200);
    - loop: the last page points back to the page before it (A -> B -> A).
    A kind whose page does not exist (too few pages) is left out.
    """

    _PLAIN, _EMPTY, _REPEAT = 0, 1, 2

    def __init__(self, inner: SyntheticDataSet | HostileNames, kinds: frozenset[str]) -> None:
        unknown = kinds - set(BAD_PAGE_KINDS)
        if unknown:
            raise ValueError(f"unknown bad-page kinds: {', '.join(sorted(unknown))}")
        self.inner = inner
        self.synthetic = inner.inner if isinstance(inner, HostileNames) else inner
        self.kinds = kinds
        self.page_size = inner.page_size
        self.total = inner.total
        self.identity = inner.identity + "/bad:" + ",".join(sorted(kinds))

    def lookup(self, name: str) -> Entry | None:
        return self.inner.lookup(name)

    def _cursor(self, number: int, variant: int) -> bytes:
        return bytes([variant]) + self.synthetic.cursor(number)

    def answer(self, cursor: bytes | None) -> PageAnswer:
        variant, number = self._PLAIN, 0
        if cursor is not None:
            if len(cursor) != 9 or cursor[0] > self._REPEAT:
                raise ValueError("cursor of a different data set")
            variant = cursor[0]
            number = int.from_bytes(cursor[1:], "big")
            if number >= self.synthetic.pages:  # page 0 is allowed: the loop may point to it
                raise ValueError("page number out of range")
        last = self.synthetic.pages - 1
        if variant == self._EMPTY:
            return PageAnswer([], self._cursor(number, self._PLAIN))
        names, _ = self.inner.page(None if number == 0 else self.synthetic.cursor(number))
        following: bytes | None = self._cursor(number + 1, self._PLAIN) if number < last else None
        if variant == self._REPEAT:
            return PageAnswer(names, following)
        if number == 0 and "empty" in self.kinds and last >= 1:
            following = self._cursor(1, self._EMPTY)
        elif number == 1 and "repeat" in self.kinds:
            following = self._cursor(1, self._REPEAT)
        if number == last and "loop" in self.kinds and last >= 1:
            following = self._cursor(last - 1, self._PLAIN)
        if number == 2 and "content-type" in self.kinds:
            return PageAnswer(names, following, content_type="text/html")
        if number == 3 and "malformed" in self.kinds:
            return PageAnswer(names, following, malformed=True)
        return PageAnswer(names, following)

    def page(self, cursor: bytes | None) -> tuple[list[str], bytes | None]:
        answer = self.answer(cursor)
        return answer.names, answer.next_cursor


class HugeFirstPage:
    """The first page lists the first `count` names (--huge-page) instead of page_size; the
    pages after it hold page_size names each, starting right after them. Cursors are start
    indexes (8 bytes), bound to `count` by the identity. The first page is never built as a
    list: first_page() streams its exact bytes in chunks and knows their length up front."""

    BATCH = 4096  # names a chunk: ~60 KB, about the transport's high-water mark

    def __init__(self, inner: SyntheticDataSet, count: int) -> None:
        if count < 1:
            raise ValueError("the huge page needs at least one name")
        self.inner = inner
        self.count = min(count, inner.files)
        self.page_size = inner.page_size
        self.total: int | None = inner.files
        self.identity = f"{inner.identity}/huge:{self.count}"
        # Every name of a synthetic data set has the same length and needs no JSON escape.
        self._name_bytes = len(inner.name(0)) if inner.files else 0

    def lookup(self, name: str) -> Entry | None:
        return self.inner.lookup(name)

    def _start(self, cursor: bytes) -> int:
        if len(cursor) != 8:
            raise ValueError("cursor of a different data set")
        start = int.from_bytes(cursor, "big")
        if not self.count <= start < self.inner.files or (start - self.count) % self.page_size:
            raise ValueError("cursor out of range")
        return start

    def _following(self, stop: int) -> bytes | None:
        return stop.to_bytes(8, "big") if stop < self.inner.files else None

    def page(self, cursor: bytes | None) -> tuple[list[str], bytes | None]:
        start = 0 if cursor is None else self._start(cursor)
        stop = min(self.inner.files, start + (self.count if cursor is None else self.page_size))
        return [self.inner.name(i) for i in range(start, stop)], self._following(stop)

    def next_of_first(self) -> bytes | None:
        return self._following(self.count)

    def first_page(self, token: str | None) -> tuple[int, Iterator[bytes]]:
        """(Content-Length, chunks) of the first page: render_page's bytes, name by name."""
        tail = (b"" if token is None else b',"NextMarker":' + json.dumps(token).encode("ascii"))
        tail = b"]" + tail + b"}\n"
        head = b'{"FileNames":['
        count = self.count
        length = len(head) + count * (self._name_bytes + 2) + max(0, count - 1) + len(tail)
        return length, self._chunks(head, tail)

    def _chunks(self, head: bytes, tail: bytes) -> Iterator[bytes]:
        name = self.inner.name
        for start in range(0, self.count, self.BATCH):
            names = '","'.join(name(i) for i in range(start, min(self.count, start + self.BATCH)))
            yield (head if start == 0 else b",") + b'"' + names.encode("ascii") + b'"'
        yield (head if self.count == 0 else b"") + tail


def as_answer(dataset: DataSet, cursor: bytes | None) -> PageAnswer:
    if isinstance(dataset, BadPages):
        return dataset.answer(cursor)
    if isinstance(dataset, HugeFirstPage) and cursor is None:
        return PageAnswer([], dataset.next_of_first(), huge=True)
    names, following = dataset.page(cursor)
    return PageAnswer(names, following)
