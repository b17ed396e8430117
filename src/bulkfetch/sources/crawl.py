"""A web server's directory tree as a source (`--api index`, or a URL ending in '/' that
answers a directory listing): each directory's listing page read by sources/autoindex.py,
its files fetched by plain GETs, its subdirectories listed in turn, many at once
(listing/tree_lister.py). Items are paths relative to the start URL ("a/b/file.txt").

A size the listing states exactly goes with its file, and a body of another length fails
as changed since it was listed; a rounded size ('12K') is only an estimate and checks
nothing. Only links one level below a directory, on the same scheme, host and port, are
entries (autoindex's rules): never '../', sort links, or links elsewhere.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote, urlsplit

import pycurl

from bulkfetch.config import (
    DEFAULT_MAX_PAGE_SIZE,
    CrawlOptions,
    RequestAuth,
    Timeouts,
    TlsOptions,
)
from bulkfetch.errors import UsageError
from bulkfetch.net.curl import (
    header_value,
    perform_get,
    retry_after_seconds,
    retryable_status,
)
from bulkfetch.sources.abilities import Abilities
from bulkfetch.sources.autoindex import ListingFormatError, parse_listing
from bulkfetch.sources.fileserver import CREDENTIALS_NEEDED, not_http, redact
from bulkfetch.sources.headers import HostHeaders, auth_curl_options
from bulkfetch.sources.list_handle import ListHandle
from bulkfetch.sources.listed import ListedPage, ListingError, listing_transfer_error
from bulkfetch.sources.tree import (
    LATER_PART,
    REFUSED,
    DirPage,
    depth,
    pages_of,
    parse_token,
)
from bulkfetch.util.checksum_lines import HEX_LENGTHS, ChecksumReader
from bulkfetch.util.globs import key_filter
from bulkfetch.util.names import all_plain

# Checksum files a directory may hold, read before its files are fetched (names compared in
# lower case), and the digest each gives
SUM_FILES = {"sha256sums": "sha256", "sha256sums.txt": "sha256", "md5sums": "md5",
             "md5sums.txt": "md5"}
# A file's own checksum beside it ("x.tar.sha256" for "x.tar"), by its suffix in lower case
SIDECARS = {".sha256": "sha256", ".sha256sum": "sha256", ".md5": "md5", ".md5sum": "md5"}
PROBE_TIMEOUT_S = 10.0  # the most a URL's first answer is waited for when guessing its kind
_LISTING_TYPES = re.compile(r"text/html|application/xhtml|application/json|text/xml|"
                            r"application/xml")


def directory_url(url: str) -> str:
    """`url` as a directory's (ending in '/'); UsageError for one that cannot be."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise not_http(url)
    if parts.query or parts.fragment:
        raise UsageError(f"URL {redact(url)!r}: a directory listing's URL has no query or "
                         "fragment")
    try:
        parts.port  # noqa: B018  # raises ValueError for a port that is not 0-65535
    except ValueError:
        raise UsageError(f"URL {redact(url)!r}: the port must be a number from 0 to "
                         "65535") from None
    return url if url.endswith("/") else url + "/"


class IndexSource:
    def __init__(self, url: str, crawl: CrawlOptions, timeouts: Timeouts,
                 max_page_size: int, tls: TlsOptions | None = None,
                 auth: RequestAuth | None = None) -> None:
        self.top = directory_url(url)
        self.crawl = crawl
        self.max_page_size = max_page_size
        self.tls = tls or TlsOptions()
        self.taken = key_filter(crawl.include, crawl.exclude)
        self._url_format = self.top.replace("%", "%%") + "%s"
        auth = auth or RequestAuth()
        # Every listing and file is under the top URL: its origin alone gets the headers.
        self.headers = HostHeaders(auth, (self.top,)) if auth.headers else None
        self.curl_options = tuple(auth_curl_options(auth))
        lines = [(pycurl.HTTPHEADER, self.headers(self.top))] if self.headers else []
        self.lists = ListHandle(timeouts, self.tls, max_page_size,
                                [*self.curl_options, *lines])

    def describe(self) -> str:
        return f"{redact(self.top)} (directory listings)"

    def abilities(self) -> Abilities:
        return Abilities(tree=self, curl_options=self.curl_options,
                         request_headers=self.headers,
                         follows_redirects=self.headers is not None)

    def max_depth(self) -> int | None:
        return self.crawl.max_depth

    # -- files -------------------------------------------------------------------------
    def resolve(self, item: str) -> tuple[str, str]:
        if REFUSED in item:
            reason = item.partition(REFUSED)[2]
            raise ValueError(reason)
        return item, self.top + quote(item, safe="/", errors="surrogateescape")

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        if not all_plain(items):
            return None
        return map(self._url_format.__mod__, items)

    # -- directories -------------------------------------------------------------------
    def dir_url(self, path: str) -> str:
        return self.top + quote(path, safe="/", errors="surrogateescape")

    def list_handle(self) -> pycurl.Curl:
        return self.lists.new()

    def transfer_error(self, code: int, message: str, url: str) -> ListingError:
        return listing_transfer_error(code, message, url, f"listing {redact(url)}",
                                      self.max_page_size, self.tls)

    def dir_page(self, path: str, status: int, headers: list[bytes], body: bytes,
                 url: str) -> DirPage:
        asked = self.dir_url(path)
        where = f"listing {redact(asked)}"
        top = path == ""
        if status in (404, 410):
            raise ListingError(f"{where}: HTTP {status}: no directory there"
                               + (". Check the URL" if top else ""),
                               retryable=False, usage=top)
        if status in (401, 403):
            raise ListingError(f"{where}: {status} — " + (CREDENTIALS_NEEDED if top else
                                                         "the server refuses to list it"),
                               retryable=False, usage=top)
        if 300 <= status < 400 and self.headers is not None:
            raise ListingError(f"{where}: HTTP {status}, moved to "
                               f"{redact(header_value(headers, b'location') or '?')}; with "
                               "request headers a listing's redirect is not followed (give "
                               "the URL it names)", retryable=False, usage=top)
        if status != 200:
            retry_after = retry_after_seconds(header_value(headers, b"retry-after"))
            raise ListingError(f"{where}: HTTP {status}", retryable_status(status), retry_after)
        if urlsplit(url).path != urlsplit(asked).path:
            # Links on the page are relative to where it was found: a directory moved
            # elsewhere would be read as another one.
            raise ListingError(f"{where}: the server redirected it to {redact(url)}; not "
                               "followed (give that URL to crawl it)", retryable=False,
                               usage=top)
        content_type = header_value(headers, b"content-type")
        try:
            listing = parse_listing(body, content_type, asked)
        except (ListingFormatError, ValueError) as exc:
            raise ListingError(f"{where}: not a directory listing ({exc})", retryable=False,
                               usage=top) from None
        taken, limit = self.taken, self.crawl.max_depth
        files: list[str] = []
        sizes: list[int] = []
        mtimes: list[int] = []
        estimated = 0
        for entry in listing.files:
            item = path + entry.name
            if taken is not None and not taken(item):
                continue
            files.append(item)
            mtimes.append(entry.mtime if entry.mtime is not None else -1)
            if entry.size is not None and entry.size_exact:
                sizes.append(entry.size)
            else:
                sizes.append(-1)
                estimated += entry.size is not None
        below = limit is None or depth(path) < limit
        dirs = tuple(path + entry.name + "/" for entry in listing.dirs) if below else ()
        return DirPage(tuple(files), tuple(sizes), dirs, estimated, tuple(mtimes),
                       _checksum_files(path, files))

    def file_url(self, item: str) -> str:
        return self.resolve(item)[1]

    def read_sums(self, item: str, status: int, body: bytes) -> dict[str, str]:
        if status != 200:
            return {}
        directory, _, name = item.rpartition("/")
        prefix = directory + "/" if directory else ""
        if name.lower() not in SUM_FILES:
            return _read_sidecar(item, body)
        algorithm = SUM_FILES[name.lower()]
        reader = ChecksumReader(io.BytesIO(body), algorithm)
        mark = "sha256:" if algorithm == "sha256" else ""
        return {prefix + entry.path.removeprefix("./"): mark + entry.expected
                for entry in reader if ".." not in entry.path.split("/")}

    def list_page(self, token: str | None) -> ListedPage:
        """One page as a journaled token names it (listing/tree_lister.py lists the tree
        itself, many directories at once; this lists one again)."""
        try:
            path, part = parse_token(token)
        except ValueError as exc:
            raise ListingError(str(exc), retryable=False) from None
        url, handle = self.dir_url(path), self.lists.get()
        try:
            status, headers, body = perform_get(handle, url)
        except pycurl.error as exc:
            code, message = exc.args[0], exc.args[1] if len(exc.args) > 1 else ""
            raise self.transfer_error(code, message, url) from None
        found = handle.getinfo(pycurl.EFFECTIVE_URL) or url
        pages = pages_of(path, self.dir_page(path, status, headers, body, found))
        return pages[part][1] if part < len(pages) else ListedPage((), LATER_PART)


def _checksum_files(path: str, files: Sequence[str]) -> tuple[str, ...]:
    """The checksum files among a directory's `files` (items): SHA256SUMS and the like, and
    sidecars ("x.sha256") of a file listed beside them."""
    names = {item[len(path):] for item in files}
    found = []
    for item in files:
        name = item[len(path):]
        stem, dot, suffix = name.rpartition(".")
        if name.lower() in SUM_FILES or (
                dot and "." + suffix.lower() in SIDECARS and stem in names):
            found.append(item)
    return tuple(found)


def _read_sidecar(item: str, body: bytes) -> dict[str, str]:
    """{file: digest} from sidecar `item` ("dir/x.tar.sha256" checks "dir/x.tar"): its first
    line's hex, alone or followed by a name that must be the file's own (`sha256sum x.tar >
    x.tar.sha256` writes it so); {} for anything else."""
    target, _, suffix = item.rpartition(".")
    algorithm = SIDECARS["." + suffix.lower()]
    words = body.split(b"\n", 1)[0].split(None, 1)
    if not words:
        return {}
    digest = words[0].decode("ascii", "replace").lower()
    named = words[1].strip().lstrip(b"*").decode("utf-8", "replace") if len(words) > 1 \
        else ""
    if len(digest) != HEX_LENGTHS[algorithm] or digest.strip("0123456789abcdef") or (
            named and named.rpartition("/")[2] != target.rpartition("/")[2]):
        return {}
    return {target: ("sha256:" if algorithm == "sha256" else "") + digest}


def answers_a_listing(url: str, timeouts: Timeouts, tls: TlsOptions,
                      auth: RequestAuth | None = None) -> str | None:
    """The kind of directory listing `url` answers ("html", "nginx-json" ...: a page with at
    least one entry), asked with `auth`'s headers, or None: anything else, or no answer
    within PROBE_TIMEOUT_S."""
    try:
        top = directory_url(url)
    except UsageError:
        return None
    auth = auth or RequestAuth()
    lines = [(pycurl.HTTPHEADER, HostHeaders(auth, (top,))(top))] if auth.headers else []
    handle = ListHandle(timeouts, tls, DEFAULT_MAX_PAGE_SIZE,
                        [*auth_curl_options(auth), *lines]).new()
    handle.setopt(pycurl.TIMEOUT_MS, int(min(PROBE_TIMEOUT_S, timeouts.total_s or
                                             PROBE_TIMEOUT_S) * 1000))
    try:
        status, headers, body = perform_get(handle, top)
        found = handle.getinfo(pycurl.EFFECTIVE_URL) or top
    except pycurl.error:
        return None
    finally:
        handle.close()
    content_type = header_value(headers, b"content-type") or ""
    if status != 200 or not _LISTING_TYPES.search(content_type.lower()) or \
            urlsplit(found).path != urlsplit(top).path:
        return None
    try:
        listing = parse_listing(body, content_type, top)
    except ValueError:
        return None
    return listing.format if listing.files or listing.dirs else None
