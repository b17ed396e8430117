"""Redirects the engine follows itself: when a request carries headers of the user's, libcurl
must not follow (it would carry any custom header to another host), so the listing and the
fetcher each take the Location and ask again, with the headers chosen for the new URL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:
    from bulkfetch.engine.big import BigFiles

MAX_HOPS = 5  # as libcurl's MAXREDIRS in curl.py
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


def next_hop(url: str, location: str | None) -> tuple[str | None, str]:
    """(the URL a redirect from `url` to `location` leads to, "") or (None, why not): only
    http(s), only a URL libcurl can take."""
    if not location:
        return None, "a redirect without a Location"
    target = urljoin(url, location.strip())
    if urlsplit(target).scheme not in ("http", "https"):
        return None, "a redirect to a URL that is not http(s)"
    if any(ch in target for ch in "\0\r\n ") or not urlsplit(target).hostname:
        return None, "a redirect to a malformed URL"
    return target, ""


def follow_big(big: BigFiles, transfer: tuple[Any, ...], body: Any, location: str | None
               ) -> None:
    """A redirect the engine follows itself (Fetcher.follows: requests carry the user's
    headers), for a big body (a spooling.SpooledBody: --spool-above 0, a retry from the
    listed URL) or a piece of one (a parts.Part: a partial file resumed from its listed
    URL): asked again at the Location, with that host's headers (Fetcher.sign), at most
    MAX_HOPS hops. A piece moves its whole file there."""
    fetcher = big.fetcher
    ranged = getattr(body, "file", None)  # a piece's file
    if ranged is not None and ranged.cancelled:
        return
    if ranged is None:
        body.spool.discard()
    state, name, url, attempt = transfer[:4]
    target, why = fetcher._hop(state, name, url, location)
    if target is None:
        if ranged is not None:
            big._drop(ranged)
        fetcher._fail(state, name, why, attempt, url, in_gate=False)
        return
    if ranged is None:
        big.pending.appendleft((state, name, target, attempt))
        return
    ranged.transfer = (state, name, target, ranged.transfer[3])
    big.pending.appendleft((state, name, target, attempt, body))
