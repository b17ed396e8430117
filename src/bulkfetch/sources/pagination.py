"""How a JSON listing asks for its next page, by style (ApiShape.paginate):

- token:  the page holds a token (--next PATH), sent in a query parameter (--next-param);
- url:    the page holds the next page's whole URL (--next PATH), relative or absolute;
- link:   the response's `Link: <...>; rel="next"` header (RFC 8288);
- offset: ?<page-param>=<offset>&<limit-param>=<page-size>, moved by the items listed;
- page:   ?<page-param>=<number>, counted up from --first-page;
- none:   one page.

The token a page is journaled under must let a rerun ask for exactly that page again: the
opaque token, the next page's URL (url, link), the offset or the page number. None is the
first page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, urljoin

from bulkfetch.config import ApiShape
from bulkfetch.sources.headers import origin_of

# One link-value of a Link header: <target> then its parameters up to the next link-value.
_LINK = re.compile(r'<([^>]*)>((?:\s*;\s*[^;,"=]+(?:=\s*(?:"[^"]*"|[^;,]*))?)*)')
_REL = re.compile(r'(?i);\s*rel\s*=\s*(?:"([^"]*)"|([^;,\s]+))')


def link_next(values: list[str]) -> str | None:
    """The target of the first rel="next" link in these Link header values (a rel may list
    several relation types: rel="next last"), as given (maybe relative); else None."""
    for value in values:
        for match in _LINK.finditer(value):
            for rel in _REL.finditer(match[2]):
                if "next" in (rel[1] if rel[1] is not None else rel[2]).lower().split():
                    return match[1].strip()
    return None


def with_param(url: str, name: str, value: str) -> str:
    """`url` with name=value added to its query (the fragment, if any, dropped)."""
    url = url.partition("#")[0]
    separator = "&" if "?" in url else "?"
    if url.endswith(("?", "&")):
        separator = ""
    return f"{url}{separator}{quote(name, safe='')}={quote(value, safe='')}"


class PageError(ValueError):
    """The page's pagination cannot be followed (a next URL on another host, a next token
    that is not a string): a broken or hostile server, not worth another attempt."""


@dataclass(frozen=True)
class Paginator:
    shape: ApiShape
    list_url: str  # the first page's URL

    def request_url(self, token: str | None) -> str:
        """The URL that lists the page journaled under `token`."""
        shape, style = self.shape, self.shape.paginate
        if style in ("url", "link"):
            if token is None:
                return self.list_url
            self.check_host(token)
            return token
        url = self.list_url
        if style == "token":
            return url if token is None else with_param(url, shape.next_param or "", token)
        if style in ("offset", "page"):
            start = self.first()
            url = with_param(url, shape.page_param or "", token if token is not None
                             else str(start))
            if shape.limit_param:
                url = with_param(url, shape.limit_param, str(shape.page_size))
        return url

    def first(self) -> int:
        if self.shape.first_page is not None:
            return self.shape.first_page
        return 0 if self.shape.paginate == "offset" else 1

    def next_token(self, token: str | None, url: str, following: object,
                   links: list[str], count: int, total: int | None) -> str | None:
        """The token of the page after the one `token` listed from `url`: `following` is what
        --next found in it, `links` its Link header values, `count` its items, `total` the
        listing's files when the page says. None: it was the last page."""
        style = self.shape.paginate
        if style == "token":
            return self._token(following)
        if style == "url":
            target = self._token(following)
            return None if target is None else self._absolute(url, target)
        if style == "link":
            target = link_next(links)
            return None if not target else self._absolute(url, target)
        if style in ("offset", "page"):
            size = self.shape.page_size
            if count == 0 or (size is not None and count < size):
                return None
            at = int(token) if token is not None else self.first()
            if style == "offset":
                at += count
                if total is not None and at >= total:
                    return None
                return str(at)
            return str(at + 1)
        return None

    @staticmethod
    def _token(following: object) -> str | None:
        if following is None or following == "":
            return None
        if isinstance(following, int) and not isinstance(following, bool):
            return str(following)
        if not isinstance(following, str):
            raise PageError(f"the next page's token is a {type(following).__name__}, not a "
                            "string")
        return following

    def _absolute(self, url: str, target: str) -> str:
        absolute = urljoin(url, target)
        self.check_host(absolute)
        return absolute

    def check_host(self, url: str) -> None:
        """PageError unless `url` may be listed: http(s), and on the listing's own origin
        unless --allow-cross-host-pages (a listing must not send the run, and its headers,
        wherever a page says)."""
        origin = origin_of(url)
        if origin is None or any(ch in url for ch in "\0\r\n "):
            raise PageError(f"the next page's URL {url[:200]!r} is not an http(s) URL")
        if not self.shape.allow_cross_host_pages and origin != origin_of(self.list_url):
            raise PageError(f"the next page's URL is on {origin[0]}://{origin[1]}:{origin[2]}"
                            ", not the listing's host (--allow-cross-host-pages allows it)")
