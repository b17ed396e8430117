"""Plain HTTP GETs for the source contract: what a resolved URL really serves, fetched by
one keep-alive libcurl handle (a few thousand small files a second on loopback), with the
headers a signed source says each request needs. Nothing of bulkfetch's fetcher is used:
the URL alone has to be enough."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass

import pycurl

from bulkfetch.sources.base import data_url_body

Signer = Callable[[str], list[str]]


@dataclass(frozen=True)
class Fetched:
    size: int
    md5: str
    body: bytes


class Getter:
    """GET url -> Fetched (or AssertionError naming the URL and status); answers are kept
    by URL and signature headers alike, so two sources naming the same URL cost one GET."""

    def __init__(self) -> None:
        self.handle = pycurl.Curl()
        self.handle.setopt(pycurl.NOSIGNAL, 1)
        self.handle.setopt(pycurl.CONNECTTIMEOUT, 10)
        self.handle.setopt(pycurl.TIMEOUT, 30)
        # The body exactly as sent: a source's URL must not depend on client decoding.
        self.handle.setopt(pycurl.HTTP_CONTENT_DECODING, 0)
        self.seen: dict[str, Fetched] = {}

    def get(self, url: str, signer: Signer | None = None) -> Fetched:
        if url.startswith("data:"):  # a body the listing itself carries (a table's JSON)
            body = data_url_body(url)
            return Fetched(len(body), hashlib.md5(body).hexdigest(), body)
        known = self.seen.get(url) if signer is None else None
        if known is not None:
            return known
        buffer = io.BytesIO()
        handle = self.handle
        handle.setopt(pycurl.URL, url)
        handle.setopt(pycurl.HTTPHEADER, signer(url) if signer is not None else [])
        handle.setopt(pycurl.WRITEDATA, buffer)
        handle.perform()
        status = handle.getinfo(pycurl.RESPONSE_CODE)
        body = buffer.getvalue()
        assert status == 200, f"GET {url} answered {status}: {body[:200]!r}"
        fetched = Fetched(len(body), hashlib.md5(body).hexdigest(), body)
        if signer is None:
            self.seen[url] = fetched
        return fetched

    def close(self) -> None:
        self.handle.close()
