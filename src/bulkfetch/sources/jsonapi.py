"""Any paginated JSON listing API, by shape (config.ApiShape): JMESPath expressions into the
page and its items (jsonpaths.py), a pagination style (pagination.py), and request headers
sent only to the listing's and the files' hosts (headers.py).

An item is its name, or "name NUL url" when the listing gives the file's own URL (as a
table's items are, sources/table.py). The sizes and digests a listing states ride in the
ListedPage (sizes; md5s: hex MD5, or "sha256:<hex>" when only a SHA-256 is listed) and the
fetcher checks each body against them, as it does S3's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import quote, urljoin, urlsplit

import pycurl

from bulkfetch.config import (
    DEFAULT_MAX_PAGE_SIZE,
    ApiShape,
    RequestAuth,
    SourceShape,
    Timeouts,
    TlsOptions,
)
from bulkfetch.errors import UsageError
from bulkfetch.net.curl import (
    header_value,
    perform_get,
)
from bulkfetch.net.redirects import MAX_HOPS, REDIRECT_STATUSES, next_hop
from bulkfetch.sources.abilities import Abilities
from bulkfetch.sources.fileserver import (
    CREDENTIALS_NEEDED,
    _where,
    json_page,
    not_http,
    redact,
)
from bulkfetch.sources.headers import HostHeaders, auth_curl_options
from bulkfetch.sources.jsonpaths import column, compile_path, hex_digests, size_of
from bulkfetch.sources.list_handle import ListHandle
from bulkfetch.sources.listed import ListedPage, ListingError, listing_transfer_error
from bulkfetch.sources.pagination import PageError, Paginator
from bulkfetch.util.names import all_plain, is_plain


def file_template(template: str, base_url: str) -> tuple[str, str]:
    """(prefix, suffix) of a file's URL around its quoted name. A template is a path put
    after the URL given (its query left out: "/get/{name}"), or with {origin} a whole URL
    built from it: {origin} its scheme://host:port, {seg[N]} the Nth segment of its path
    (from 0), as the Hugging Face Hub's files are at /ORG/REPO/resolve/REV/PATH."""
    if "{origin}" not in template and "{seg" not in template:
        prefix, _, suffix = template.partition("{name}")
        return base_url.split("?")[0].rstrip("/") + prefix, suffix
    parts = urlsplit(base_url)
    try:
        whole = template.format(origin=f"{parts.scheme}://{parts.netloc}",
                                seg=parts.path.split("/")[1:], name="\0")
    except (IndexError, KeyError, ValueError) as exc:
        raise UsageError(f"--get-template {template!r} does not fit the listing URL "
                         f"{redact(base_url)} ({exc!r}); it may use {{name}}, {{origin}} and "
                         "{seg[N]}, the Nth segment of the URL's path from 0") from None
    prefix, _, suffix = whole.partition("\0")
    return prefix, suffix


class JsonApiSource:
    def __init__(self, base_url: str, shape: SourceShape, api: ApiShape,
                 auth: RequestAuth | None = None, timeouts: Timeouts | None = None,
                 max_page_size: int = DEFAULT_MAX_PAGE_SIZE,
                 tls: TlsOptions | None = None) -> None:
        parts = urlsplit(base_url)
        try:
            parts.port  # noqa: B018  # raises ValueError for a port that is not 0-65535
        except ValueError:
            raise UsageError(f"URL {redact(base_url)!r}: the port must be a number from 0 to "
                             "65535") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise not_http(base_url)
        self.base = base_url
        self.shape = shape
        self.api = api
        self.auth = auth or RequestAuth()
        self.timeouts = timeouts or Timeouts()
        self.max_page_size = max_page_size
        self.tls = tls or TlsOptions()
        # With a list path the URL is a base, as the seed API's; without, the listing itself.
        self.list_url = base_url.rstrip("/") + shape.list_path if shape.list_path \
            else base_url
        self.pages = Paginator(api, self.list_url)
        self._items = compile_path(api.items, "--items")
        self._name = compile_path(api.name, "--name")
        self._size = compile_path(api.size, "--size") if api.size else None
        self._md5 = compile_path(api.md5, "--md5") if api.md5 else None
        self._sha256 = compile_path(api.sha256, "--sha256") if api.sha256 else None
        self._url = compile_path(api.url, "--url") if api.url else None
        self._total = compile_path(api.total, "--total") if api.total else None
        self._next = compile_path(api.next, "--next") if api.next else None
        self._get_prefix, self._get_suffix = file_template(shape.get_template, base_url)
        self._url_format = self._get_prefix.replace("%", "%%") + "%s" + \
            self._get_suffix.replace("%", "%%")
        # Headers go to the listing's origin and the files' (the template's; each item's
        # own URL as resolve() meets it); the listing's requests only to its own origin.
        self.headers: HostHeaders | None = None
        self.list_headers: HostHeaders | None = None
        if self.auth.headers:
            self.headers = HostHeaders(self.auth, (self.list_url, self._get_prefix))
            self.list_headers = HostHeaders(self.auth, (self.list_url,))
        # (the same options go on every handle: Abilities.curl_options)
        self.list_handle = ListHandle(self.timeouts, self.tls, self.max_page_size,
                                      auth_curl_options(self.auth))

    def describe(self) -> str:
        return redact(self.list_url)

    def abilities(self) -> Abilities:
        """With the user's headers, each request's headers are chosen by its URL's host
        (HostHeaders, never empty), and libcurl follows no redirect: the engine does, each
        hop with its own host's headers. --netrc's credentials go on every handle: libcurl
        sends them only to the host they are for."""
        return Abilities(curl_options=self.list_handle.options, request_headers=self.headers,
                         follows_redirects=self.headers is not None,
                         listing_patience=self.list_handle.be_patient)

    # -- resolving --------------------------------------------------------------------------
    def resolve(self, item: str) -> tuple[str, str]:
        if "\0" in item:
            name, _, url = item.rpartition("\0")
            if not url:
                raise ValueError("unsafe name: the name holds a NUL")
            if self.headers is not None:
                self.headers.allow(url)
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"the listed URL {redact(url)!r} is not http(s)")
            return name, url
        quoted = item if is_plain(item) else quote(item, safe="/")
        return item, self._get_prefix + quoted + self._get_suffix

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        if not all_plain(items):  # (an item holding its URL is never plain: it has a NUL)
            return None
        return map(self._url_format.__mod__, items)

    # -- listing ----------------------------------------------------------------------------
    def list_page(self, token: str | None) -> ListedPage:
        try:
            url = self.pages.request_url(token)
        except PageError as exc:
            raise ListingError(f"{_where(self.list_url)}: {exc}", retryable=False) from None
        status, headers, body, url = self._get(url)
        if status in (401, 403):
            given = "; the credentials given were refused" if self.auth.headers or \
                self.auth.netrc else ""
            raise ListingError(f"{_where(url)}: {status} — {CREDENTIALS_NEEDED}{given}",
                               retryable=False, usage=True)
        if status == 404 and token is not None and self.api.paginate == "page":
            # A page number past the last one: Django REST framework answers 404 ("Invalid
            # page.") when the count is a multiple of the page size, where a shorter page
            # would have said it was the last. Only after the first page: a first 404 is
            # a wrong URL.
            return ListedPage((), None)
        page = json_page(url, status, headers, body, first=token is None)
        try:
            return self.parse(page, token, url, headers)
        except (PageError, ValueError) as exc:
            if token is None:  # the first page: the flags do not fit this API (exit 2)
                raise ListingError(f"{_where(url)}: {exc}. Check the listing flags (--items, "
                                   "--name, ...) or --api against the first page",
                                   retryable=False, usage=True) from None
            raise ListingError(f"{_where(url)}: {exc}", retryable=False) from None

    def parse(self, page: object, token: str | None, url: str,
              headers: Sequence[bytes] = ()) -> ListedPage:
        """The ListedPage of a parsed JSON page that `token` listed from `url`. ValueError
        (PageError) when the page is not of the shape."""
        api = self.api
        items = self._items(page)
        if items is None:  # (GCS leaves "items" out of an empty page)
            items = []
        elif not isinstance(items, list):
            raise PageError(f"--items {api.items!r} is a {type(items).__name__}, not a list")
        names = column(self._name, items)
        try:
            joined = "".join(names)  # a C-speed check that every name is a str
        except TypeError:
            at = next(i for i, name in enumerate(names) if not isinstance(name, str))
            raise PageError(f"item {at}: --name {api.name!r} is {str(names[at])[:60]!r}, not "
                            "a string") from None
        sizes = self._sizes(items) if self._size is not None else None
        md5s = self._digests(items) if self._md5 or self._sha256 else None
        if self._url is not None:
            listed = self._items_with_urls(names, items, url)
        elif "\0" in joined:  # (a NUL would split "name NUL url": see resolve())
            listed = [name + "\0" if "\0" in name else name for name in names]
        else:
            listed = names
        total = self._total(page) if self._total is not None else None
        if total is not None:
            total = size_of(total)
        if total is None or total < 0:
            total_text = header_value(list(headers), b"x-total-files") if headers else None
            total = int(total_text) if total_text and total_text.isdigit() else None
        following = self._next(page) if self._next is not None else None
        links = self._links(headers) if api.paginate == "link" else []
        next_token = self.pages.next_token(token, url, following, links, len(items), total)
        return ListedPage(tuple(listed), next_token, total, sizes, md5s)

    def _sizes(self, items: list[object]) -> tuple[int, ...] | None:
        assert self._size is not None
        raw = column(self._size, items)
        try:
            sizes = tuple(value if type(value) is int and value >= 0 else size_of(value)
                          for value in raw)
        except ValueError as exc:
            raise PageError(f"--size {self.api.size!r}: {exc}") from None
        return sizes if any(size >= 0 for size in sizes) else None

    def _digests(self, items: list[object]) -> tuple[str, ...] | None:
        """Each item's hex MD5, else "sha256:<hex>", else "" (nothing to check)."""
        md5s = [""] * len(items)
        try:
            if self._md5 is not None:
                md5s = hex_digests(column(self._md5, items), 16, "md5")
            if self._sha256 is not None:
                shas = hex_digests(column(self._sha256, items), 32, "sha256")
                md5s = [md5 or (f"sha256:{sha}" if sha else "")
                        for md5, sha in zip(md5s, shas, strict=True)]
        except ValueError as exc:
            raise PageError(str(exc)) from None
        return tuple(md5s) if any(md5s) else None

    def _items_with_urls(self, names: list[str], items: list[object], page_url: str
                         ) -> list[str]:
        """name NUL absolute-url for items whose --url is a string; the bare name (the
        --get-template URL) for those with none."""
        assert self._url is not None
        parts = urlsplit(page_url)
        origin = f"{parts.scheme}://{parts.netloc}"
        listed = []
        append = listed.append
        for name, own in zip(names, column(self._url, items), strict=True):
            if type(own) is str and own:
                # urljoin() costs 4 us an item: the usual spellings are joined by hand
                if own.startswith(("https://", "http://")):
                    absolute = own
                elif own[0] == "/" and own[1:2] != "/":
                    absolute = origin + own
                else:
                    absolute = urljoin(page_url, own)
                if "\0" in absolute:  # (never a NUL in a URL: see resolve())
                    absolute = absolute.replace("\0", "%00")
                append(f"{name}\0{absolute}")
            elif own is None or own == "":
                append(name + "\0" if "\0" in name else name)
            else:
                raise PageError(f"--url {self.api.url!r} of {name[:60]!r} is not a string")
        return listed

    @staticmethod
    def _links(headers: Sequence[bytes]) -> list[str]:
        return [line.decode("latin-1").partition(":")[2] for line in headers
                if line[:5].lower() == b"link:"]

    def _get(self, url: str) -> tuple[int, list[bytes], bytes, str]:
        """GET a list page: (status, header lines, body, the URL that answered). With
        headers to send, redirects are followed here, at most MAX_HOPS, each hop with the
        headers for its own host."""
        handle = self.list_handle.get()
        hops = 0
        while True:
            if self.list_headers is not None:
                handle.setopt(pycurl.HTTPHEADER, self.list_headers(url))
            try:
                status, headers, body = perform_get(handle, url)
            except pycurl.error as exc:
                code, message = exc.args[0], exc.args[1] if len(exc.args) > 1 else ""
                raise listing_transfer_error(code, message,
                                             handle.getinfo(pycurl.EFFECTIVE_URL) or url,
                                             _where(url), self.max_page_size,
                                             self.tls) from None
            if self.list_headers is None:  # libcurl followed: relative links are from there
                return status, headers, body, handle.getinfo(pycurl.EFFECTIVE_URL) or url
            if status not in REDIRECT_STATUSES:
                return status, headers, body, url
            target, why = next_hop(url, header_value(headers, b"location"))
            if target is None or hops >= MAX_HOPS:
                raise ListingError(f"{_where(url)}: {why or f'more than {MAX_HOPS} redirects'}",
                                   retryable=False)
            url, hops = target, hops + 1
