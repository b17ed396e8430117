"""One web server directory listing page (an "autoindex") read as the entries of one directory:
its files (name, URL, size, mtime) and its subdirectories. Pure: bytes in, DirListing out.

What it reads, each checked against a page captured from the real server
(tests/unit/fixtures/autoindex/); an HTML page's links are found by autoindex_html.py, their
sizes and dates read by autoindex_fields.py:

- HTML, generically: every <a href> is a candidate entry, a directory when the link ends in
  '/'. Size and mtime are added where the layout ties them to one link: the cells of the
  link's table row (Apache's HTMLTable, lighttpd's mod_dirlisting, Caddy's browse, whose
  data-order/data-size attribute is the exact size), or the text after the link on its own
  line (nginx's and Apache's FancyIndexing <pre>). Sizes written with a unit ('12K', '1.0K',
  '3M', lighttpd's '0.1K') are estimates and marked so; a bare number of bytes is exact.
  A <ul> of links (python http.server, Apache without FancyIndexing) gives names only.
- nginx `autoindex_format json` (exact sizes, mtime in RFC 1123 form) and Caddy's JSON
  (asked for with Accept: application/json); nginx `autoindex_format xml`.

Times without a zone (nginx's and Apache's HTML, lighttpd) are read as UTC, which they are
unless the server was set to local time (nginx's autoindex_localtime): minutes at best.

The safety rules, the reason this module exists: a link is an entry only when it resolves
(urljoin against the page's URL) to the same scheme, host and port, exactly one path segment
below the page's directory, with no query or fragment; its name is that segment decoded
(percent-encoding; HTML entities are decoded by the HTML parser), and never holds '/' or NUL
nor is '.' or '..'. Anything else is skipped, with the reason, never raised: parent and
sort links, links elsewhere, mailto: and javascript:. An entry's URL is rebuilt from its
name (percent-encoded), so one file has one URL however the page spelled its link. The
entries come in the page's order, each name once (the first link to a name wins).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from urllib.parse import SplitResult, quote, unquote_to_bytes, urljoin, urlsplit

from bulkfetch.sources.autoindex_fields import Found, parse_http_time, parse_iso_time
from bulkfetch.sources.autoindex_html import html_links, page_text

DEFAULT_PORTS = {"http": 80, "https": 443}
_UNRESERVED = re.compile(r"[A-Za-z0-9_.\-~]+")  # what quote() leaves as it is
# A segment as quote(safe="") writes it: unreserved characters and upper-case escapes of
# anything else
_CANONICAL = re.compile(r"(?:[A-Za-z0-9_.\-~]|%[0-9A-F]{2})+")
_NEEDLESS_ESCAPE = re.compile(r"%(?:2[DE]|3[0-9]|4[1-9A-F]|5[0-9AF]|6[1-9A-F]|7[0-9AE])")
# A relative link to one segment below, which urljoin would not change: not '.', '..', a
# scheme ('a:b'), a path ('/x', 'a/b'), nor what urlsplit strips (whitespace)
_ONE_SEGMENT = re.compile(r"[^/?#\\:.\s][^/?#\\:\s]*/?")


@dataclass(frozen=True, slots=True)
class ListedFile:
    name: str  # one path segment, decoded (a non-UTF-8 byte as a lone surrogate)
    url: str  # absolute, the page's URL and the name percent-encoded
    size: int | None  # bytes, None where the listing does not say
    size_exact: bool  # False: the listing rounded it ('12K'), an estimate
    mtime: int | None  # Unix time, None where the listing does not say


@dataclass(frozen=True, slots=True)
class ListedDir:
    name: str
    url: str  # ends in '/'
    mtime: int | None = None


@dataclass(frozen=True, slots=True)
class SkippedLink:
    href: str  # as the page gave it (entities decoded)
    reason: str


@dataclass(frozen=True, slots=True)
class DirListing:
    url: str  # the page's URL, a directory's (ends in '/')
    format: str  # "html", "nginx-json", "caddy-json" or "nginx-xml"
    files: tuple[ListedFile, ...]
    dirs: tuple[ListedDir, ...]
    skipped: tuple[SkippedLink, ...] = ()


class ListingFormatError(ValueError):
    """A page that says it is JSON or XML and is not a listing in that form."""


def parse_listing(body: bytes, content_type: str | None, base_url: str) -> DirListing:
    """The entries of the directory listing `body`, fetched from `base_url` (after any
    redirect: the directory's URL, ending in '/') with the Content-Type `content_type`.
    ValueError for a base_url that is not an http(s) directory URL; ListingFormatError for
    a JSON or XML page that is not a listing."""
    scope = _Scope(base_url)
    mime = (content_type or "").partition(";")[0].strip().lower()
    start = body.lstrip()[:64]
    if mime == "application/json" or (not mime and start.startswith(b"[")):
        kind, found = _json_links(body)
    elif mime in ("text/xml", "application/xml") or (
            not mime and start.startswith(b"<?xml") and b"<list>" in body[:256]):
        kind, found = "nginx-xml", _xml_links(body)
    else:
        kind, found = "html", html_links(page_text(body, content_type))
    return scope.listing(kind, found)


# -- the safety rules ------------------------------------------------------------------------
class _Scope:
    """Which links are entries of the directory at `base_url`, and under which names."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        if parts.query or parts.fragment or not parts.path.endswith("/"):
            raise ValueError(f"not a directory's URL (one ending in '/', no query): "
                             f"{base_url!r}")
        self.base = base_url
        self.origin = self._origin(parts)
        # Compared decoded: '%C3%A9' and 'é', '%7e' and '~' name the same directory
        self.segments = [unquote_to_bytes(s) for s in parts.path.split("/")[1:-1]]

    @staticmethod
    def _origin(parts: SplitResult) -> tuple[object, ...]:
        scheme = parts.scheme.lower()
        port = parts.port or DEFAULT_PORTS.get(scheme)
        return scheme, parts.hostname, port, parts.username, parts.password

    def entry(self, href: str) -> tuple[str, bool] | str:
        """(name, is a directory) for a link to an entry here, else why it is not one."""
        href = href.strip()
        if not href:
            return "empty link"
        if "\\" in href:  # browsers read it as '/', urljoin does not: ambiguous, so neither
            return "backslash in link"
        if "?" in href or "#" in href:
            return "query or fragment"
        if _ONE_SEGMENT.fullmatch(href):  # 'a%20b.txt', 'sub/': one level down, no urljoin
            return self._named(href.removesuffix("/"), href.endswith("/"))
        try:
            parts = urlsplit(urljoin(self.base, href))
            if self._origin(parts) != self.origin:
                return "elsewhere (another scheme, host or port)"
        except ValueError:  # a port that is not a number, a bad IPv6 literal
            return "not a URL"
        segments = parts.path.split("/")[1:]
        depth = len(self.segments)
        if len(segments) <= depth or \
                [unquote_to_bytes(s) for s in segments[:depth]] != self.segments:
            return "outside this directory"
        rest = segments[depth:]
        is_dir = len(rest) == 2 and rest[1] == ""
        if len(rest) > 2 or (len(rest) == 2 and not is_dir):
            return "more than one level down"
        if rest[0] == "":
            return "this directory itself"
        return self._named(rest[0], is_dir)

    @staticmethod
    def _named(segment: str, is_dir: bool) -> tuple[str, bool] | str:
        name = segment if "%" not in segment else \
            unquote_to_bytes(segment).decode("utf-8", "surrogateescape")
        if "/" in name or "\x00" in name or name in (".", ".."):  # '%2F', '%00', '%2e%2e'
            return "not a single path segment"
        return name, is_dir

    def url(self, name: str, is_dir: bool) -> str:
        quoted = name if _UNRESERVED.fullmatch(name) else \
            quote(name, safe="", errors="surrogateescape")
        return self.base + quoted + "/" * is_dir

    def listing(self, kind: str, found: list[Found]) -> DirListing:
        files: dict[str, ListedFile] = {}
        dirs: dict[str, ListedDir] = {}
        skipped: list[SkippedLink] = []
        for link in found:
            entry = link.refused or self.entry(link.href)
            if isinstance(entry, str):
                skipped.append(SkippedLink(link.href, entry))
                continue
            name, is_dir = entry
            if name in files or name in dirs:
                if (name in dirs) != is_dir:
                    skipped.append(SkippedLink(link.href, "listed as a file and a directory"))
                continue  # the same entry again (an icon's link, say): the first stands
            # The link as it came when it is already what quote() makes of the name (nginx's
            # and python's are): the cost of quoting a name is a tenth of a large listing's
            segment = link.href.removesuffix("/")
            url = self.base + link.href if _CANONICAL.fullmatch(segment) and \
                not _NEEDLESS_ESCAPE.search(segment) else self.url(name, is_dir)
            if is_dir:
                dirs[name] = ListedDir(name, url, link.mtime)
            else:
                files[name] = ListedFile(name, url, link.size,
                                         link.size_exact and link.size is not None, link.mtime)
        return DirListing(self.base, kind, tuple(files.values()), tuple(dirs.values()),
                          tuple(skipped))


# -- JSON and XML ------------------------------------------------------------------------------
def _json_links(body: bytes) -> tuple[str, list[Found]]:
    try:
        items = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ListingFormatError(f"a JSON listing that is not JSON: {exc}") from None
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ListingFormatError("a JSON listing that is not a list of objects")
    if items and "is_dir" in items[0]:
        return "caddy-json", [_caddy_item(item) for item in items]
    return "nginx-json", [_nginx_item(item) for item in items]


def _exact(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def _nginx_item(item: dict[str, object]) -> Found:
    # {"name":"a b.txt", "type":"file", "mtime":"Wed, 01 Jan 2025 00:00:00 GMT", "size":5}
    name, kind = item.get("name"), item.get("type")
    if not isinstance(name, str) or kind not in ("file", "directory"):
        return Found(str(name), refused=f"an entry of type {kind!r}")
    mtime = item.get("mtime")
    size = _exact(item.get("size"))
    return Found(quote(name, safe="") + "/" * (kind == "directory"), size, True,
                  parse_http_time(mtime) if isinstance(mtime, str) else None)


def _caddy_item(item: dict[str, object]) -> Found:
    # {"name":"a b.txt","size":5,"url":"./a%20b.txt","mod_time":"2025-01-01T02:02:00Z",
    #  "is_dir":false, ...}
    url, is_dir = item.get("url"), item.get("is_dir") is True
    if not isinstance(url, str) or url.endswith("/") != is_dir:
        return Found(str(url), refused="a URL that does not say what is_dir says")
    mtime = item.get("mod_time")
    return Found(url, None if is_dir else _exact(item.get("size")), True,
                  parse_iso_time(mtime) if isinstance(mtime, str) else None)


def _xml_links(body: bytes) -> list[Found]:
    # <list><directory mtime="2025-01-02T00:00:00Z">sub dir</directory>
    #       <file mtime="2025-01-01T00:00:00Z" size="12345">100%.bin</file></list>
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:  # nginx sends neither; entities expand
        raise ListingFormatError("an XML listing with a DOCTYPE or ENTITY")
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise ListingFormatError(f"an XML listing that is not XML: {exc}") from None
    if root.tag != "list":
        raise ListingFormatError(f"an XML listing whose root is <{root.tag}>, not <list>")
    found = []
    for element in root:
        name = element.text or ""
        if element.tag not in ("file", "directory"):
            found.append(Found(name, refused=f"an entry of type <{element.tag}>"))
            continue
        size_text = element.get("size", "")
        size = int(size_text) if size_text.isascii() and size_text.isdigit() else None
        found.append(Found(quote(name, safe="") + "/" * (element.tag == "directory"), size,
                            True, parse_iso_time(element.get("mtime", ""))))
    return found
