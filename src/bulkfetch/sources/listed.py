"""What a listing gives back: a page of items (ListedPage), with what the listing states of
them, or the reason it could not (ListingError)."""

from __future__ import annotations

from dataclasses import dataclass

import pycurl

from bulkfetch.config import TlsOptions
from bulkfetch.net.curl import tls_failure, unreachable


@dataclass(frozen=True, slots=True)
class ListedPage:
    items: tuple[str, ...]
    next_token: str | None
    total: int | None = None  # files in the whole listing, when the source says so
    sizes: tuple[int, ...] | None = None  # the items' sizes, when the listing says them
    md5s: tuple[str, ...] | None = None  # the items' MD5s (hex, "" unknown), likewise
    plain: bool = False  # every item is a plain name (names.is_plain), as the source checked
    # the items' modification times (Unix seconds, -1 unknown), when the listing says them
    # (a web server's directory listing): what --sync compares with DEST's
    mtimes: tuple[int, ...] | None = None
    estimated: int = 0  # items whose listed size was rounded ('12K'), so checks nothing


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


def listed_mtimes(page: ListedPage, items: tuple[str, ...]) -> tuple[int, ...] | None:
    """The modification times `page` states for `items` (its own items or some of them)."""
    if page.mtimes is None or items is page.items:
        return page.mtimes
    at = {item: index for index, item in enumerate(page.items)}
    return tuple(page.mtimes[at[item]] for item in items)


class ListingError(Exception):
    """A page could not be listed. `retryable`: another attempt may succeed; `usage`: only
    the user can fix it."""

    def __init__(self, message: str, retryable: bool, retry_after_s: float | None = None,
                 usage: bool = False, unreachable: bool = False):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        # The user must change something (credentials, bucket, trust): the run stops with
        # exit status 2, and rerunning the same command would not help.
        self.usage = usage
        # No server answered (refused, unknown host, no TLS there): worth another try once
        # the source has answered in this run, the user's to fix before (listing/lister.py).
        self.unreachable = unreachable


def listing_transfer_error(code: int, message: str, url: str, where: str, max_page_size: int,
                           tls: TlsOptions | None) -> ListingError:
    """What a list request libcurl failed with means (`url`: where it went, after any
    redirect; `where`: the listing, for the message): a page over --max-page-size or a
    refused certificate is final, anything else is worth another try."""
    if code == pycurl.E_FILESIZE_EXCEEDED:
        return ListingError(f"{where}: a list page larger than {max_page_size:,} bytes; a "
                            "server sending pages this large is broken or hostile (raise "
                            "--max-page-size if you trust it)", retryable=False)
    if code == pycurl.E_TOO_MANY_REDIRECTS:  # the same request would loop the same way
        return ListingError(f"{where}: the listing redirects on and on (a loop?): {message} "
                            f"(curl error {code})", retryable=False)
    fatal = tls_failure(code, message, url, tls)
    if fatal is not None:  # retrying would only ask the same certificate again
        return ListingError(fatal, retryable=False, usage=True)
    nobody = unreachable(code, message, url)
    if nobody is not None:
        return ListingError(f"{where}: {nobody}", retryable=True, unreachable=True)
    return ListingError(f"{where}: {message} (curl error {code})", retryable=True)
