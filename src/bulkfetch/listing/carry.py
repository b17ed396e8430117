"""Pages that never end inside a sample (for --sink tar, where a sample must be whole in one
shard).

Listing is sorted, so a sample's members (names with one key: samples.split_key) are
neighbours, but a page may end between two of them. The lister holds each page until the
next one is listed; when that one starts with the key the held page ends with, the held
page's trailing group is cut off and sent at the head of the next page. The journal keeps
each page by the token that lists it, so the carried items travel in the tokens themselves:
a page's token names the source's token and the items carried into it, and its next token
the items carried out of it. A page is listed again (resume, --retry-failed) exactly as it
was sent, whatever the version or settings of the run that journaled it; without a carry a
token is the source's own, as before. A page is sent one listing late (the next page must be
seen first): the lister runs pages ahead anyway.
"""

from __future__ import annotations

import json
from collections.abc import Callable

_MARK = "\0bulkfetch-carry:"  # a server's token never starts with NUL in practice
MAX_CARRY = 10_000  # items: a bigger "sample" is not one; the page goes out as listed


def encode(token: str | None, carried: tuple[str, ...]) -> str | None:
    if not carried:
        return token
    return _MARK + json.dumps([token, list(carried)])


def decode(token: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(the source's token, the items carried into the page) of a journaled token."""
    if token is None or not token.startswith(_MARK):
        return token, ()
    source_token, carried = json.loads(token[len(_MARK):])
    return source_token, tuple(carried)


def cut(items: tuple[str, ...], following: str | None, key_of: Callable[[str], str]) -> int:
    """Where the page `items` ends so that no sample goes on into the next page, whose
    first item is `following`: the start of the trailing group that shares its key, or
    len(items) (no cut) when the next page starts another sample, or when that group is
    the whole page or too big to be a sample."""
    if not items or following is None:
        return len(items)
    key = key_of(following)
    if key_of(items[-1]) != key:
        return len(items)
    start = len(items) - 1
    while start > 0 and len(items) - start < MAX_CARRY and key_of(items[start - 1]) == key:
        start -= 1
    if start == 0 or len(items) - start >= MAX_CARRY:
        return len(items)
    return start
