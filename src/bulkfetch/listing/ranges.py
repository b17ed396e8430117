"""Key ranges for listing a sorted key space in parallel (an S3 bucket): what a page's token
says, which ranges are left after a kill, and where to split a range that turns out long.

A range is (after, upto]: the keys k with after < k <= upto (None: no bound). ListObjectsV2's
`start-after` lists a range from its start; a page past `upto` is cut there. A page's token
names its range from the page's first key on; its next token, the same range from the
page's last key (or says the range ended). So the journal's tokens alone tell what is
listed: a page covers (after, next after], or (after, upto] when its range ended there.
After a kill, the ranges left are the gaps between the covered intervals: no key listed
twice, none missed, whatever ranges had been split off and not listed yet.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from bulkfetch.sources.abilities import KeyRange

_MARK = "range:"


def token(span: KeyRange) -> str:
    """The token of a page listing `span` from its start."""
    return _MARK + json.dumps([span.after, span.upto])


def end_token(span: KeyRange) -> str:
    """The next token of a page that ended its range (never None: None ends the listing)."""
    return _MARK + json.dumps([span.after, span.upto, "end"])


def parse(text: str) -> tuple[KeyRange, bool]:
    """(the range, whether it is an end token) of a token; ValueError if not one."""
    if not text.startswith(_MARK):
        raise ValueError(f"not a key range token: {text[:40]!r}")
    fields = json.loads(text[len(_MARK):])
    if not isinstance(fields, list) or len(fields) not in (2, 3) or not all(
            value is None or isinstance(value, str) for value in fields[:2]):
        raise ValueError(f"not a key range token: {text[:40]!r}")
    return KeyRange(fields[0], fields[1]), len(fields) == 3


_INF = (1, "")  # above every key


def _high(bound: str | None) -> tuple[int, str]:
    """An upper bound as a sortable value (None: above every key)."""
    return _INF if bound is None else (0, bound)


def _upper(value: tuple[int, str]) -> str | None:
    return None if value == _INF else value[1]


EVERY_KEY = KeyRange(None, None)


def gaps(covered: Iterable[KeyRange], whole: KeyRange = EVERY_KEY) -> list[KeyRange]:
    """The parts of `whole` no interval of `covered` holds, in key order. (Keys are never
    empty, so `after` None and "" are one bound.)"""
    spans = sorted((span.after or "", _high(span.upto)) for span in covered)
    end = _high(whole.upto)
    reached = (0, whole.after or "")  # every key up to here is covered
    left: list[KeyRange] = []
    for after, upto in spans:
        start = (0, after)
        if start > reached:  # nothing covers (reached, after]
            stop = min(start, end)
            if stop > reached:
                left.append(KeyRange(reached[1] or None, _upper(stop)))
        reached = max(reached, upto)
        if reached >= end:
            return left
    if end > reached:
        left.append(KeyRange(reached[1] or None, _upper(end)))
    return left


def covered_by(tokens: Iterable[tuple[str, str | None]]) -> list[KeyRange]:
    """The key intervals journaled pages cover, from their (token, next token)."""
    found = []
    for page_token, next_token in tokens:
        span, _ = parse(page_token)
        if next_token is None:  # not a range page's: the listing ended with it
            found.append(KeyRange(span.after, span.upto))
            continue
        following, ended = parse(next_token)
        found.append(KeyRange(span.after, span.upto if ended else following.after))
    return found


def _alphabet(chars: Iterable[str]) -> str:
    """The smallest usual alphabet that holds every observed character of a position."""
    seen = set(chars)
    for alphabet in ("0123456789", "0123456789abcdef", "0123456789ABCDEF",
                     "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                     "0123456789abcdefghijklmnopqrstuvwxyz",
                     "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                     "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"):
        if seen <= set(alphabet):
            return alphabet
    return ""


def split_points(keys: Sequence[str], span: KeyRange, levels: int = 3) -> list[str]:
    """Where to cut what is left of `span` after a page of `keys` (sorted, the page's raw
    keys), guessing from their shape how the keys go on.

    The keys share a prefix P; past this page the keys most likely differ earlier than
    inside it (file-000000..file-000999, then file-001000...). So for the last `levels`
    positions of P, each character above the last key's in the alphabet seen there gives a
    cut: file-001, ..., file-009, file-01, ..., file-09, file-1, ..., file-9. A cut c splits
    (a, b] into (a, c] and (c, b]: every key that starts with c goes right, as a whole
    group. No cut falls inside a name's first dot-suffix (a webdataset sample stays in one
    range), nor outside `span`. Empty ranges cost one request each; a long one is split
    again when its own first page comes back.
    """
    if not keys:
        return []
    first, last = keys[0], keys[-1]
    common = 0
    for a, b in zip(first, last, strict=False):
        if a != b:
            break
        common += 1
    prefix = last[:common]
    slash = prefix.rfind("/")
    dot = prefix.find(".", slash + 1)
    limit = dot if dot >= 0 else len(prefix)
    floor = 0  # cuts start after what `last` shares with the range's end
    if span.upto is not None:
        for a, b in zip(last, span.upto, strict=False):
            if a != b:
                break
            floor += 1
    cuts: set[str] = set()
    for position in range(min(limit, len(prefix) + 1) - 1, max(floor, 0) - 1, -1):
        if position < 0 or position >= len(last) or (cuts and levels <= 0):
            break
        here = last[position]
        # inside the common prefix every key has `here` at this position (sorted keys)
        alphabet = _alphabet(here)
        if here not in alphabet:
            continue
        levels -= 1
        for char in alphabet[alphabet.index(here) + 1:]:
            cut = last[:position] + char
            if cut > last and (span.upto is None or cut < span.upto):
                cuts.add(cut)
    return sorted(cuts)
