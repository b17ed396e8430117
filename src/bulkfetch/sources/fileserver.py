"""A paginated JSON listing API: the seed API by default, any of its shape via SourceShape."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote, urlsplit

import pycurl

from bulkfetch.config import DEFAULT_MAX_PAGE_SIZE, SourceShape, Timeouts, TlsOptions
from bulkfetch.errors import UsageError
from bulkfetch.net.curl import (
    header_value,
    perform_get,
    retry_after_seconds,
    retryable_status,
)
from bulkfetch.sources.abilities import Abilities
from bulkfetch.sources.list_handle import ListHandle
from bulkfetch.sources.listed import ListedPage, ListingError, listing_transfer_error
from bulkfetch.util.names import all_plain, is_plain


def redact(url: str) -> str:
    """A URL fit for messages: no user-info, no query string (it may hold signatures)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        if parts.port:
            host += f":{parts.port}"
    except ValueError:  # a port that is not a number: never raise while describing
        host += ":?"
    return f"{parts.scheme}://{host}{parts.path}" + ("?…" if parts.query else "")


def not_http(url: str) -> UsageError:
    """The error for a URL that is not http(s)://HOST..., quoting it as typed (credentials
    masked), with the fix when it only lacks its scheme."""
    shown = re.sub(r"(?<=//)[^/@]*@", "***@", url)
    hint = f" (did you mean http://{shown}?)" if "://" not in url and url[:1].isalnum() else ""
    return UsageError(f"URL {shown!r} must start with http:// or https:// and name a "
                      f"host{hint}")


CREDENTIALS_NEEDED = "the listing needs credentials (see --header/--bearer-env)"


def _where(url: str) -> str:
    """How messages name a list page (built only when a message needs it)."""
    return f"listing {redact(url)}"


def json_page(url: str, status: int, headers: list[bytes], body: bytes,
              first: bool = False) -> object:
    """A list page's answer parsed as JSON; raises ListingError for anything else (a
    status, retried when the status says so; HTML; malformed JSON, retried). `first`: the
    run's first page, where a 404 or 410 means the URL is wrong (rerunning cannot help)."""
    if first and status in (404, 410):
        raise ListingError(f"{_where(url)}: HTTP {status}: nothing is listed there. Check the "
                           "URL (and --api, if one was given; a web server's directory "
                           "listing: end the URL with '/', or give --api index)",
                           retryable=False, usage=True)
    if status in (401, 403):  # the same request gets the same answer: only the user can act
        raise ListingError(f"{_where(url)}: {status} — {CREDENTIALS_NEEDED}",
                           retryable=False, usage=True)
    if status != 200:
        retry_after = retry_after_seconds(header_value(headers, b"retry-after"))
        raise ListingError(f"{_where(url)}: HTTP {status}", retryable_status(status),
                           retry_after)
    content_type = (header_value(headers, b"content-type") or "").lower()
    if "html" in content_type:
        raise ListingError(f"{_where(url)}: expected JSON, the server sent {content_type}: "
                           f"{_opening(body)}{_NOT_A_LISTING if first else ''}",
                           retryable=False, usage=first)
    try:
        return json.loads(body)
    except ValueError as exc:
        # On the run's first page the URL is likely not a listing (a login page, a proxy's
        # error page): the same command fails the same way. Later, a server's passing fault.
        shown = f"{content_type or 'no Content-Type'}: {_opening(body)}" if body else \
            "an empty body"
        raise ListingError(f"{_where(url)}: malformed JSON ({exc}), the server sent {shown}"
                           f"{_NOT_A_LISTING if first else ''}", retryable=not first,
                           usage=first) from None


_NOT_A_LISTING = (". Is the URL a listing (the seed API's GET /list)? For another JSON "
                  "listing give --api or --items/--name")


def _opening(body: bytes, limit: int = 80) -> str:
    """The first bytes of an answer, quoted for a message."""
    text = body[:limit].decode("utf-8", "replace")
    return repr(text) + ("…" if len(body) > limit else "")


class FileServerSource:
    def __init__(self, base_url: str, shape: SourceShape, timeouts: Timeouts,
                 max_page_size: int = DEFAULT_MAX_PAGE_SIZE,
                 tls: TlsOptions | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise not_http(base_url)
        try:
            parts.port  # noqa: B018  # raises ValueError for a port that is not 0-65535
        except ValueError:
            raise UsageError(f"URL {redact(base_url)!r}: the port must be a number from 0 to "
                             "65535") from None
        self.base = base_url.rstrip("/")
        self.shape = shape
        self.timeouts = timeouts
        self.max_page_size = max_page_size
        self.tls = tls or TlsOptions()
        self.list_handle = ListHandle(self.timeouts, self.tls, max_page_size)
        prefix, _, suffix = shape.get_template.partition("{name}")
        self._get_prefix, self._get_suffix = self.base + prefix, suffix
        self._url_format = self._get_prefix.replace("%", "%%") + "%s" + suffix.replace("%", "%%")

    def describe(self) -> str:
        return redact(self.base)

    def abilities(self) -> Abilities:
        # plain GETs, checked by what the server states
        return Abilities(listing_patience=self.list_handle.be_patient)

    def list_url(self, token: str | None) -> str:
        url = self.base + self.shape.list_path
        if token is not None:
            url += f"?{self.shape.marker_param}={quote(token, safe='')}"
        return url

    def resolve(self, item: str) -> tuple[str, str]:
        quoted = item if is_plain(item) else quote(item, safe="/")
        return item, self._get_prefix + quoted + self._get_suffix

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        if not all_plain(items):
            return None
        return map(self._url_format.__mod__, items)  # one C call per URL

    def list_page(self, token: str | None) -> ListedPage:
        url = self.list_url(token)
        status, headers, body = self._get(url)
        first = token is None
        return self._validate(json_page(url, status, headers, body, first=first), headers, url,
                              first)

    def _validate(self, page: object, headers: list[bytes], url: str,
                  first: bool = False) -> ListedPage:
        names_key, next_key = self.shape.names_key, self.shape.next_key
        # On the first page, JSON of another shape says URL is not a seed listing: the same
        # command would fail the same way (exit 2); later, a server that broke (exit 1).
        hint = _NOT_A_LISTING if first else ""
        if not isinstance(page, dict) or not isinstance(page.get(names_key), list):
            raise ListingError(f"{_where(url)}: no {names_key!r} list in the JSON{hint}",
                               retryable=False, usage=first)
        names = page[names_key]
        try:
            "".join(names)  # a C-speed check that every entry is a str (3x a set of types)
        except TypeError:
            raise ListingError(f"{_where(url)}: {names_key!r} holds non-string entries{hint}",
                               retryable=False, usage=first) from None
        following = page.get(next_key)
        if following is not None and (not isinstance(following, str) or not following):
            raise ListingError(f"{_where(url)}: {next_key!r} is not a non-empty string",
                               retryable=False)
        total_text = header_value(headers, b"x-total-files")
        total = int(total_text) if total_text and total_text.isdigit() else None
        return ListedPage(tuple(names), following, total)

    def _get(self, url: str) -> tuple[int, list[bytes], bytes]:
        handle = self.list_handle.get()
        try:
            return perform_get(handle, url)
        except pycurl.error as exc:
            code, message = exc.args[0], exc.args[1] if len(exc.args) > 1 else ""
            raise listing_transfer_error(code, message,
                                         handle.getinfo(pycurl.EFFECTIVE_URL) or url,
                                         _where(url), self.max_page_size, self.tls) from None
