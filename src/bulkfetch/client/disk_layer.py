"""A Client's disk cache (`cache_dir=`): the part between its calls and httpcache.py.

Before a URL goes to the loop: a fresh entry answers it; a stale one makes the request
conditional (If-None-Match / If-Modified-Since ride in the page, Page.headers). What comes
back is settled on the caller's thread, not the loop's (a store is a file write and a
transaction: the loop's turn would wait on it): a 200 is stored as its headers allow, a
batch in one transaction; a 304 renews the entry and answers with its body, and when that
entry is gone meanwhile (another process replaced or evicted it) the URL is asked for
again, unconditionally.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from bulkfetch.client.freshness import response_headers
from bulkfetch.client.httpcache import Entry, HttpCache

__all__ = ["Answer", "DiskLayer", "NotModified"]


class Answer:
    """A 200's body with its header lines (as the loop hands it to the caller's thread)."""

    __slots__ = ("body", "lines", "md5")

    def __init__(self, body: bytes, lines: list[bytes] | None, md5: str | None) -> None:
        self.body = body
        self.lines = lines
        self.md5 = md5


class NotModified:
    """A 304 to a conditional request, with its header lines."""

    __slots__ = ("lines",)

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines


class DiskLayer:
    def __init__(self, cache: HttpCache) -> None:
        self.cache = cache
        # The cache failing (disk full, the index locked for longer than the busy timeout)
        # costs a miss or an entry, never the caller its body: counted, the last one kept.
        self.errors = 0
        self.last_error: BaseException | None = None
        # 304s that came for an entry gone meanwhile (replaced or evicted): asked again
        self.asked_again = 0

    def lookup(self, url: str) -> bytes | Entry | None:
        try:
            return self.cache.lookup(url)
        except (OSError, sqlite3.Error) as exc:
            self._failed(exc)
            return None

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = exc

    @staticmethod
    def request_headers(entry: Entry | None) -> str:
        """Page.headers' text for one item: its conditional headers, "" for none."""
        return "\n".join(entry.conditional_headers()) if entry is not None else ""

    def settle(self, results: Iterable[tuple[int, object]], urls: dict[int, str],
               stale: dict[int, Entry]) -> tuple[list[tuple[int, object]], list[int]]:
        """`results` (position, Answer | NotModified | FetchError) of a call whose URLs by
        position are `urls` and whose stale entries asked about are `stale`: (position,
        body or FetchError) as the call takes them, and the positions to ask for again."""
        out: list[tuple[int, object]] = []
        again: list[int] = []
        stores: list[tuple[str, bytes, dict[str, str], str | None]] = []
        renew: list[tuple[int, Entry, dict[str, str]]] = []
        for position, result in results:
            entry = stale.pop(position, None)
            if isinstance(result, Answer):
                if result.lines is not None:  # (None: a body fetched in ranges, not kept)
                    stores.append((urls[position], result.body,
                                   response_headers(result.lines), result.md5))
                out.append((position, result.body))
            elif isinstance(result, NotModified):
                if entry is None:  # (never: only a stale entry's request is conditional)
                    again.append(position)
                else:
                    renew.append((position, entry, response_headers(result.lines)))
            else:
                out.append((position, result))
        if renew:  # the 304s of the batch in one transaction
            try:
                bodies = self.cache.refresh_many((entry, headers)
                                                 for _, entry, headers in renew)
            except (OSError, sqlite3.Error) as exc:
                self._failed(exc)
                bodies = [None] * len(renew)  # asked for again, unconditionally
            for (position, _, _), body in zip(renew, bodies, strict=True):
                if body is None:
                    again.append(position)
                else:
                    out.append((position, body))
        self.asked_again += len(again)
        if stores:
            try:
                self.cache.store_many(stores)
            except (OSError, sqlite3.Error) as exc:
                self._failed(exc)
        return out, again
