"""A body too big to hold in memory, streamed into the sink's spool as it arrives.

Small bodies are collected in memory by the cheapest callback there is (list.append, one
call per file). libcurl's MAXFILESIZE stops a transfer whose body turns out to be larger
than --spool-above (by its Content-Length, or once that many bytes arrived), and the fetcher
starts it again as a SpooledBody (or at once, when its source gave its size): its write
callback hashes each chunk and writes it to the spool, so a run's memory never depends on
file sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pycurl

from bulkfetch.engine.digests import (
    final_headers,
    final_status,
    md5_hasher,
    mismatch,
    new_hasher,
    stated_digests,
    strongest,
)
from bulkfetch.engine.multipart import claims, fits
from bulkfetch.sinks.base import SinkFailure, SinkFatal, Spool
from bulkfetch.sources.abilities import Pinned

# libcurl's read buffer for a spooled transfer: fewer, larger chunks through Python. The
# small-file handles keep libcurl's default (16 KiB), which costs memory per handle.
SPOOL_BUFFER = 256 << 10
DEFAULT_BUFFER = 16 << 10


@dataclass(slots=True, eq=False)
class SpooledBody:
    """One attempt at a big body: where it goes, what it hashes to, why it stopped."""

    transfer: Any  # the fetcher's transfer tuple (page state, name, url, attempt)
    spool: Spool
    lines: list[bytes]  # the handle's raw header lines
    md5: Any = None  # set in __post_init__ (digests.md5_hasher)
    other: Any = None  # a hasher for the strongest non-MD5 digest the server states
    stated: dict[str, bytes] = field(default_factory=dict)  # read at the first chunk
    size: int = 0
    charged: float = 0  # of `size`, taken from --limit-rate's bucket (pacing.BigPacing)
    total: int = -1  # the Content-Length, read at the first chunk (-1: none)
    status: int = 0  # the HTTP status, read at the first chunk
    error: SinkFailure | SinkFatal | None = None  # the sink refused a chunk
    retry_after: float | None = None
    announced: float = -1  # the Content-Length libcurl saw (-1: none)
    started: bool = False
    pinned: Pinned | None = None  # the size and digest the source vouches for, if any
    part_size: int = 0  # an object uploaded in parts of this size (multipart.py); 0: not
    verify: bool = True  # False (--no-verify): no digest is taken but an MD5 the sink keeps
    keep_md5: bool = False  # the sink records every body's MD5 (Sink.needs_md5)

    def __post_init__(self) -> None:
        self.md5 = md5_hasher(self.verify, self.keep_md5, self.pinned is not None
                              and self.pinned.algorithm not in ("", "md5"))

    def write(self, data: bytes) -> int | None:
        """libcurl's write callback. Returning 0 stops the transfer (CURLE_WRITE_ERROR):
        for a status other than 200 (its body is not the file) and for a sink error."""
        if not self.started:
            self.started = True
            # (getinfo() is refused inside a callback: the status comes from the lines)
            self.status = final_status(self.lines)
            if self.status != 200:
                return 0
            self._read_headers()
            if self.error is not None:  # not the file the source vouches for
                return 0
        pinned = self.pinned
        if pinned is not None and self.size + len(data) > pinned.size:
            self.error = SinkFailure(f"body longer than the {pinned.size:,} bytes "
                                     f"{pinned.vouched_by} gives")
            return 0
        try:
            self.spool.write(data)
        except (SinkFailure, SinkFatal) as exc:
            self.error = exc
            return 0
        self.md5.update(data)
        if self.other is not None:
            self.other.update(data)
        self.size += len(data)
        return None

    def _read_headers(self) -> None:
        headers = final_headers(self.lines)
        length = headers.get("content-length", "")
        self.total = int(length) if length.isdigit() else -1
        # a pinned digest is the trust root: what the response states adds nothing to it
        self.stated = stated_digests(headers)
        if self.pinned is not None:
            # Another size or digest than the listing's: the object changed since (or the
            # source lies). Said before a byte is taken, and not retried, as for a body
            # stopped at --spool-above (big.too_big); a stream started at once by its
            # listed size (sized.py) meets it here first.
            wrong = self.pinned.contradicts(self.pinned.size if self.total < 0 else self.total,
                                            self.stated)
            if wrong is not None:
                self.error = SinkFailure(wrong)
            self.stated = self.pinned.stated(self.stated)
        if self.part_size and not self.stated:
            found = claims(headers)
            if found is not None and fits(self.part_size, self.total, found.count):
                self.stated = found.named(self.part_size)
        other = strongest(self.stated)
        if other is not None and self.verify:
            self.other = new_hasher(other[0])

    def mismatch(self, announced: float, verify: bool) -> str | None:
        """Why the complete body is not the file the server meant, or None."""
        if announced >= 0 and announced != self.size:
            return f"body of {self.size} bytes, Content-Length {int(announced)}"
        if not verify:
            return None
        if not self.started:  # an empty body: no chunk came to read the headers at
            self._read_headers()
        pinned = self.pinned
        if pinned is not None and self.size != pinned.size:
            return f"body of {self.size} bytes, {pinned.vouched_by} gives {pinned.size}"
        return mismatch(self.stated, self.md5, self.other, "the body",
                        pinned.vouched_by if pinned is not None and pinned.algorithm else "")


def prepare(handle: pycurl.Curl, write: Callable[[bytes], int | None]) -> None:
    """A handle for a big body: `write` takes its chunks, no size limit, bigger reads."""
    handle.setopt(pycurl.WRITEFUNCTION, write)
    handle.setopt(pycurl.MAXFILESIZE_LARGE, 0)  # no limit
    handle.setopt(pycurl.BUFFERSIZE, SPOOL_BUFFER)


def restore(handle: pycurl.Curl, chunks: list[bytes], spool_above: int) -> None:
    """Back to a small-file handle."""
    handle.setopt(pycurl.WRITEFUNCTION, chunks.append)
    handle.setopt(pycurl.MAXFILESIZE_LARGE, spool_above)
    handle.setopt(pycurl.BUFFERSIZE, DEFAULT_BUFFER)
