"""What a Source may do beyond the required protocol (sources/base.py), declared once by the
source in an Abilities (as rclone's backends fill in their Features): the engine, the
listing and the contract suite read it, and none of them probes a source with getattr.

Each field's default is "cannot": a source that declares nothing is listed page by page
and fetched with plain GETs, checked by what the server states.

The value types an ability speaks in live here too: Pinned (what a source vouches for of a
file) and KeyRange / RangePage (a key space listed in ranges at once).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pycurl

    from bulkfetch.sources.listed import ListingError
    from bulkfetch.sources.tree import TreeSource

LISTING = "the listing"  # a Pinned's vouched_by for what a listing states (S3)


@dataclass(frozen=True, slots=True)
class Pinned:
    """A file's size and digest as the source itself vouches for them, before any server
    answers (a registry blob: its manifest's descriptor; an S3 object: the listing's Size
    and MD5 ETag). A digest replaces whatever digests the response states, and no more than
    `size` bytes are ever taken. With no digest (`algorithm` ""; an object uploaded in
    parts) the size alone is pinned and the response's digests are checked as usual."""

    size: int
    algorithm: str  # a hashlib name: sha256, sha512, md5; "" for the size alone
    digest: bytes
    vouched_by: str = "the source"  # for messages: "the manifest"

    def stated(self, response: dict[str, bytes]) -> dict[str, bytes]:
        """The digests to check a body against, given those its `response` states."""
        return {self.algorithm: self.digest} if self.algorithm else response

    def contradicts(self, total: int, response: dict[str, bytes]) -> str | None:
        """Why a response of `total` bytes stating `response` is not the pinned file (a lie,
        or an object that changed since it was listed), before its body is read, or None."""
        changed = "changed since it was listed: " if self.vouched_by == LISTING else ""
        if total != self.size:
            return f"{changed}Content-Length {total}, {self.vouched_by} gives {self.size}"
        if self.algorithm and response.get(self.algorithm, self.digest) != self.digest:
            return f"{changed}the server states another {self.algorithm.upper()} than " \
                f"{self.vouched_by} gives"
        return None

    def mismatch(self, body: bytes) -> str | None:
        """Why a body held in memory is not the pinned file, or None."""
        if len(body) != self.size:
            return f"body of {len(body)} bytes, {self.vouched_by} gives {self.size}"
        if not self.algorithm:
            return None
        if hashlib.new(self.algorithm, body).digest() != self.digest:
            return f"{self.algorithm.upper()} of the body does not match the digest " \
                f"{self.vouched_by} gives"
        return None


@dataclass(frozen=True, slots=True)
class KeyRange:
    """(after, upto] of a sorted key space: the keys k with after < k <= upto (None: no
    bound). The listing's tokens and split points are listing/ranges.py's."""

    after: str | None  # exclusive; None: from the first key
    upto: str | None  # inclusive; None: to the last key

    def holds(self, key: str) -> bool:
        return (self.after is None or key > self.after) and (self.upto is None
                                                             or key <= self.upto)


@dataclass(frozen=True, slots=True)
class RangePage:
    items: tuple[str, ...]  # what to fetch: the keys of the range, as items
    keys: tuple[str, ...]  # every key the store listed in the range (for split points)
    more: bool  # the range goes on after keys[-1]
    sizes: tuple[int, ...] | None = None  # the items' sizes, when the store lists them
    md5s: tuple[str, ...] | None = None  # the MD5s their ETags give (hex; "": none)
    plain: bool = False  # every item a plain name (the source checked the page at once)


class RangeSource(Protocol):
    """A source whose keys are sorted and can be listed from any key on (S3's start-after):
    listing/range_lister.py lists many ranges of it at once."""

    def list_range(self, span: KeyRange) -> RangePage:
        """One attempt at the first page of `span`. Raises ListingError."""
        ...

    def clone(self) -> RangeSource:
        """A copy for another thread (its own connection)."""
        ...


@runtime_checkable
class MultiRangeSource(Protocol):
    """A RangeSource whose list requests one curl multi can carry: list_range in pieces."""

    def list_handle(self) -> pycurl.Curl:
        """A new handle with everything a list request needs but its URL."""
        ...

    def range_url(self, span: KeyRange) -> str: ...

    def range_page(self, span: KeyRange, status: int, headers: list[bytes],
                   body: bytes) -> RangePage:
        """The page of `span` in an answer. Raises ListingError."""
        ...

    def transfer_error(self, code: int, message: str, url: str) -> ListingError: ...


@dataclass(frozen=True)
class Abilities:
    """What a source can do beyond listing pages and resolving items (see the module
    docstring). Read once, where a run's fetcher or lister is made."""

    # libcurl options set once on every file handle (S3: its checksum header; a source
    # whose requests carry the user's headers: libcurl's own redirects off)
    curl_options: tuple[tuple[int, object], ...] = ()
    # url -> the headers of a request to it, set on every transfer: signed anew (S3 SigV4),
    # a registry's bearer token, the user's --header for that host
    request_headers: Callable[[str], list[str]] | None = None
    # The engine follows this source's redirects itself, each hop with request_headers(hop):
    # libcurl's would carry the user's headers to any host a 3xx names.
    follows_redirects: bool = False
    # name -> the size and digest the source vouches for, checked in place of what the
    # server states (a registry blob's descriptor)
    pinned: Callable[[str], Pinned | None] | None = None
    # url -> whether a 401 there is worth another attempt with renewed credentials (a
    # registry's bearer token that expired early)
    reauthorize: Callable[[str], bool] | None = None
    # url -> (URL, headers) of the request that tells an object's part layout (S3's
    # HEAD ?partNumber=1): how an object uploaded in parts is checked whole
    layout_request: Callable[[str], tuple[str, list[str]]] | None = None
    # seconds -> the listing gives up on an answer that stays silent this long, and asks
    # again (listing/lister.py sets it from the pages' own times: a request a server left
    # unanswered costs seconds, not --idle-timeout)
    listing_patience: Callable[[float], None] | None = None
    # The source lists key ranges at once (S3), page after page otherwise. A MultiRangeSource
    # is listed on one curl multi, any other RangeSource by a thread per request in flight.
    ranges: RangeSource | None = None
    # The source is a tree of directories, listed many at once (listing/tree_lister.py):
    # a web server's directory listings.
    tree: TreeSource | None = None
