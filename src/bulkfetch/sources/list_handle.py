"""The one libcurl handle a page-by-page source lists with (the seed API's and a JSON
API's), made on first use: the run's timeouts and TLS, --max-page-size, the source's own
options, and the lister's patience (Abilities.listing_patience)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pycurl

from bulkfetch.config import Timeouts, TlsOptions
from bulkfetch.net.curl import new_handle


class ListHandle:
    def __init__(self, timeouts: Timeouts, tls: TlsOptions, max_page_size: int,
                 options: Sequence[tuple[int, object]] = ()) -> None:
        self.timeouts, self.tls, self.max_page_size = timeouts, tls, max_page_size
        self.options = tuple(options)
        self.patience: int | None = None  # seconds of silence before a list request ends
        self._handle: pycurl.Curl | None = None

    def get(self) -> pycurl.Curl:
        if self._handle is None:
            self._handle = self.new()
        return self._handle

    def new(self) -> pycurl.Curl:
        """Another handle with the same options (a listing that asks many pages at once)."""
        handle = new_handle(self.timeouts, self.tls)
        # libcurl refuses a larger announced Content-Length and stops a longer body.
        handle.setopt(pycurl.MAXFILESIZE_LARGE, self.max_page_size)
        if self.patience is not None:
            handle.setopt(pycurl.LOW_SPEED_TIME, self.patience)
        for option, value in self.options:
            handle.setopt(option, value)
        return handle

    def be_patient(self, seconds: float) -> None:
        """The lister's word: a list request whose answer stays silent this long ends (with
        --min-speed's low-speed check), and is asked again."""
        self.patience = max(1, math.ceil(seconds))
        if self._handle is not None:
            self._handle.setopt(pycurl.LOW_SPEED_TIME, self.patience)
