"""The Sink protocol and its two kinds of error."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from bulkfetch.models import PageReport

# write(name, body, md5 hex or None when not verified): store one complete, verified body
# under `name` (already checked by check_name); it appears under its final name only once
# fully written. Raises SinkFailure (this file) or SinkFatal (the whole run).
Writer = Callable[[str, bytes, "str | None"], None]


class SinkFailure(Exception):
    """This one file cannot be stored (the run goes on); the message is the reason."""


class SinkFatal(Exception):
    """Nothing more can be stored (disk full, read-only, I/O error): the run must stop.
    `released`: reports that became durable before the failure (a tar shard that closed
    cleanly before the next one failed), still owed to the journal."""

    def __init__(self, message: str, released: list[PageReport] | None = None) -> None:
        super().__init__(message)
        self.released: list[PageReport] = released or []


# errno values that no other file would escape: the disk, quota or filesystem itself failed.
FATAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def fatal_or_failure(exc: OSError, what: str) -> SinkFailure | SinkFatal:
    """The error an OSError while doing `what` becomes: fatal when no other file could
    fare better (disk full, read-only, I/O error), else this file's failure."""
    if exc.errno in FATAL_ERRNOS:
        return SinkFatal(f"{what}: {exc.strerror}")
    return SinkFailure(f"{what}: {exc.strerror}")


class Spool(Protocol):
    """A body too big to hold in memory, written by the fetcher as it arrives (hashed on the
    way) to where the sink keeps it until store_spool() publishes it or discard() drops it."""

    def write(self, data: bytes) -> None:
        """Append `data`. Raises SinkFailure (this file) or SinkFatal (the whole run)."""
        ...

    def discard(self) -> None:
        """Drop what was written (a failed or abandoned transfer); safe to call twice."""
        ...


@dataclass(frozen=True)
class SinkAbilities:
    """What a kind of sink does with what it is given, declared once by the class (the
    contract suite, tests/contract, checks each sink against what it declares)."""

    keeps: bool = True  # every body stored (or delivered) can be had back; null: discarded
    resumes: bool = False  # keeps a big file's partial bytes across runs (open_partial)
    ordered: bool = False  # a page's files stay whole samples in listing order (tar)


class Sink(Protocol):
    abilities: ClassVar[SinkAbilities]
    # Whether the sink keeps every stored body's MD5 (tar: its index, which dataset reads
    # and `hash --dest` check): the engine then hashes MD5 even under --no-verify, and
    # store_spool() never sees "" from it.
    needs_md5: bool

    def begin_page(self, seq: int, names: Sequence[str] = ()) -> Writer:
        """The writer for the files of page `seq`, whose names are `names` in listing
        order (each is then written once, or skipped)."""
        ...

    def skip(self, seq: int, name: str) -> None:
        """`name` of page `seq` failed: it will not be written."""
        ...

    def open_spool(self, name: str) -> Spool:
        """Somewhere to stream the body of `name` (already checked by check_name) that is
        too big for memory. Raises SinkFailure or SinkFatal."""
        ...

    def open_partial(self, key: str) -> Spool | None:
        """The partial file `key` kept across runs (created when missing), for a body
        fetched by ranges; None when this sink keeps nothing to resume."""
        ...

    def store_spool(self, seq: int, name: str, spool: Spool, size: int, md5: str) -> None:
        """Publish a complete, verified spooled body of `size` bytes as `name` of page
        `seq`, like the page's writer does for a body in memory; the spool is used up
        either way. Raises SinkFailure or SinkFatal."""
        ...

    def end_page(self, report: PageReport) -> list[PageReport]:
        """Page `report.seq` has no file left to write. Returns the reports that are now
        durable enough for the journal to mark done (this one, later, or with others)."""
        ...

    def ready(self) -> list[PageReport]:
        """Reports that became durable since, without a page ending (tar: a shard closed
        in the background). May raise SinkFatal for a failure in that background work, with
        the reports that became durable before it in its `released`."""
        ...

    def flush(self) -> list[PageReport]:
        """No more pages are coming (end of input, or a stop): make what can be durable so
        and return the reports it releases. Pages not ended by now are fetched again."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class KeepsValidators(Protocol):
    """A sink that keeps each file's HTTP validators for a later get --sync, where they are
    not its MD5 (dest/validators.py)."""

    def keep_validators(self, name: str, etag: str, modified: str) -> None:
        """The ETag, or else the Last-Modified ("" for the other), of the 200 whose body `name` was
        just written."""
        ...


@runtime_checkable
class ComparesBodies(Protocol):
    """A conditional sink that compares a 200's body with the copy it holds and leaves an
    equal one as it is (a server that ignores conditional requests): how many so far."""

    same_bodies: int


@runtime_checkable
class ConditionalSink(Protocol):
    """A sink that takes pages of conditional requests (Page.headers: get --sync, a Client's
    disk cache): it sees a 200's header lines before its body, and answers a 304 from what
    it kept (engine/conditional.py)."""

    def response_headers(self, name: str, lines: list[bytes]) -> None:
        """The header lines of the 200 whose body `name` is about to be written."""
        ...

    def not_modified(self, name: str, lines: list[bytes]) -> None:
        """A 304 answered `name`'s conditional request: what the sink kept stands. Raises
        SinkFailure when it cannot."""
        ...
