"""Redirects the engine follows itself: when a request carries headers of the user's, libcurl
must not follow (it would carry any custom header to another host), so the listing and the
fetcher each take the Location and ask again, with the headers chosen for the new URL."""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

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
