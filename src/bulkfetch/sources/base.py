"""The Source protocol: list one page by token; turn a listed item into (name, URL)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote_to_bytes

import pycurl

from bulkfetch.config import TlsOptions
from bulkfetch.net.curl import tls_failure


@dataclass(frozen=True, slots=True)
class ListedPage:
    items: tuple[str, ...]
    next_token: str | None
    total: int | None = None  # files in the whole listing, when the source says so
    sizes: tuple[int, ...] | None = None  # the items' sizes, when the listing says them
    md5s: tuple[str, ...] | None = None  # the items' MD5s (hex, "" unknown), likewise
    plain: bool = False  # every item is a plain name (names.is_plain), as the source checked


def listed_metadata(page: ListedPage, items: tuple[str, ...]
                    ) -> tuple[tuple[int, ...] | None, tuple[str, ...] | None]:
    """The sizes and MD5s `page` states for `items`, which are its own items or some of
    them (a name listed twice is fetched once; a --retry-failed run fetches only the failed)."""
    sizes, md5s = page.sizes, page.md5s
    if items is page.items or (sizes is None and md5s is None):
        return sizes, md5s
    at = {item: index for index, item in enumerate(page.items)}
    return (tuple(sizes[at[item]] for item in items) if sizes is not None else None,
            tuple(md5s[at[item]] for item in items) if md5s is not None else None)


def unusable_name(item: str) -> str:
    """The name a listed item that resolve() refused is reported and journaled under: a
    table's item is "name NUL url" (sources/table.py), any other item stands for itself."""
    return item.partition("\0")[0] or item


def data_url_body(url: str) -> bytes:
    """The body a data: URL (RFC 2397) carries: base64 when it says `;base64`, else
    percent-encoded. Raises ValueError when it is not one."""
    head, comma, data = url.partition(",")
    if not comma or not head.startswith("data:"):
        raise ValueError("a data: URL without a comma")
    if head.endswith(";base64"):
        try:
            return base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"a data: URL whose base64 is broken: {exc}") from None
    return unquote_to_bytes(data)


class ListingError(Exception):
    """A page could not be listed. `retryable`: another attempt may succeed; `usage`: only
    the user can fix it."""

    def __init__(self, message: str, retryable: bool, retry_after_s: float | None = None,
                 usage: bool = False):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        # The user must change something (credentials, bucket, trust): the run stops with
        # exit status 2, and rerunning the same command would not help.
        self.usage = usage


class Source(Protocol):
    def describe(self) -> str: ...

    def list_page(self, token: str | None) -> ListedPage:
        """One attempt at the page `token` (None: the first). Raises ListingError."""
        ...

    def resolve(self, item: str) -> tuple[str, str]:
        """(name, url) of a listed item. Raises ValueError with the reason if unusable."""
        ...

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        """The URLs of a page's items when every item is a plain name (safe as a path and
        in a URL, so name == item), else None: the caller then resolves item by item."""
        ...


def listing_transfer_error(code: int, message: str, url: str, where: str, max_page_size: int,
                           tls: TlsOptions | None) -> ListingError:
    """What a list request libcurl failed with means (`url`: where it went, after any
    redirect; `where`: the listing, for the message): a page over --max-page-size or a
    refused certificate is final, anything else is worth another try."""
    if code == pycurl.E_FILESIZE_EXCEEDED:
        return ListingError(f"{where}: a list page larger than {max_page_size:,} bytes; a "
                            "server sending pages this large is broken or hostile (raise "
                            "--max-page-size if you trust it)", retryable=False)
    fatal = tls_failure(code, message, url, tls)
    if fatal is not None:  # retrying would only ask the same certificate again
        return ListingError(fatal, retryable=False, usage=True)
    return ListingError(f"{where}: {message} (curl error {code})", retryable=True)
