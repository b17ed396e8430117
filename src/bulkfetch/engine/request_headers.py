"""The fetcher's requests whose headers are chosen per transfer: a Client's s3:// URLs
(sign_with), a cache's or a sync's conditional pages (Page.headers: a 200's headers and a
304 go to the sink), and redirects the engine follows itself when a request carries the
user's headers (each hop's headers chosen by its URL). A mixin of Fetcher: its state lives
there; none of this runs for a run that never needs it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pycurl

from bulkfetch.net.redirects import MAX_HOPS, next_hop
from bulkfetch.sinks.base import SinkFailure

# A request header with nothing after the colon is not sent (libcurl): the headers of an
# unconditional request on a handle that may have made a conditional one.
_UNCONDITIONAL = ["If-None-Match:", "If-Modified-Since:"]


class RequestHeaders:
    """Fetcher's methods for per-transfer headers (see the module docstring)."""

    def _redirected(self, handle: pycurl.Curl, transfer: Any,
                    location: str | None) -> None:
        """A redirect the fetcher follows itself (self.follows): the transfer again, at once,
        to the Location; at most MAX_HOPS hops, http(s) only."""
        chunks, lines = self.buffers[handle]
        chunks.clear()
        lines.clear()
        self.free.append(handle)
        state, name, url, attempt = transfer
        if self.gate is not None:
            self.gate.ended(url)
        target, why = self._hop(state, name, url, location)
        if target is None:
            self._fail(state, name, why, attempt, url, in_gate=False)
            return
        self.pending.appendleft((state, name, target, attempt))

    def _hop(self, state: Any, name: str, url: str,
             location: str | None) -> tuple[str | None, str]:
        """(where the redirect from `url` to `location` leads, ""), counted against the
        item's hops (a retry starts again from its listed URL: _retry_or_fail), or (None,
        why it is not followed): not http(s), or more than MAX_HOPS."""
        hops = self.hops.setdefault(state, {})
        listed_url, count = hops.get(name, (url, 0))
        target, why = next_hop(url, location)
        if target is None or count >= MAX_HOPS:
            return None, why or f"more than {MAX_HOPS} redirects"
        hops[name] = (listed_url, count + 1)
        return target, ""

    def sign_with(self, sign: Callable[[str], list[str]],
                  options: Sequence[tuple[int, Any]] = ()) -> None:
        """From now on every transfer's headers come from `sign(url)` (a Client given its
        first s3:// URL), and `options` hold for every handle, those made already and those
        to come."""
        self.sign = sign
        if self.request_headers is None:  # (a cache's _page_headers asks self.sign itself)
            self.request_headers = lambda transfer: sign(transfer[2])
        self.source_options = [*self.source_options, *options]
        for handle in self.handles:
            for option, value in options:
                handle.setopt(option, value)

    # -- a cache's pages (Page.headers: a Client's cache_dir) -------------------------------
    def _cache_page(self, state: Any, names: Sequence[str],
                    headers: tuple[str, ...]) -> None:
        """A cache's page: its items' request headers kept by name. The first such page
        switches the fetcher to per-transfer headers and to _completed_cached; a run of
        other pages never pays for either."""
        if self.on_completed != self._completed_cached:
            for needed in ("response_headers", "not_modified"):
                if not callable(getattr(self.sink, needed, None)):
                    raise TypeError(f"a page with request headers needs a sink with "
                                    f"{needed}(), not {type(self.sink).__name__}")
            self.request_headers = self._page_headers
            self.on_completed = self._completed_cached
        state.headers = {name: lines.split("\n")
                         for name, lines in zip(names, headers, strict=True) if lines}

    def _page_headers(self, transfer: Any) -> list[str]:
        """Every transfer's headers once a cache's page came: the source's (signed, if it
        signs) and the item's own. Set on every transfer, so no handle keeps another
        transfer's If-None-Match."""
        base = self.sign(transfer[2]) if self.sign is not None else self.base_headers
        extra = transfer[0].headers
        more = extra.get(transfer[1]) if extra else None
        # (an empty list would leave the handle's last list in place: pycurl sets none)
        return base + more if more else base or _UNCONDITIONAL

    def _completed_cached(self, handle: pycurl.Curl, error: tuple[int, str] | None) -> None:
        """_completed() for a fetcher that has had a cache's page. For such a page's items,
        a 200's header lines go to the sink (response_headers) before its body is written
        (it keeps them: Cache-Control, ETag ...), and a 304 to a conditional request is
        the sink's to answer from what it kept (_not_modified): a 304 has no body, so none
        of a 200's checks apply to it. Everything else is _completed()'s."""
        transfer = self.transfer_of[handle]
        extra = transfer[0].headers
        if error is None and extra is not None:
            status = handle.getinfo(pycurl.RESPONSE_CODE)
            if status == 200:
                self.sink.response_headers(  # type: ignore[attr-defined]
                    transfer[1], self.buffers[handle][1])
            elif status == 304 and transfer[1] in extra and not (
                    self.spooling and handle in self.spooling):
                self._not_modified(handle, transfer)
                return
        self._completed(handle, error)

    def _not_modified(self, handle: pycurl.Curl, transfer: Any) -> None:
        """A 304 answered the conditional request `transfer` made: the sink answers the
        item from what it kept (sink.not_modified); the item counts as stored, with no
        bytes transferred."""
        state, name, url, attempt = transfer
        self.multi.remove_handle(handle)
        if self.windows is not None:
            self.gate.done(url)  # type: ignore[union-attr]
        if self.gate is not None:
            self.gate.ended(url)  # (no body: the host's body size learns nothing)
        chunks, lines = self.buffers[handle]
        try:
            self.sink.not_modified(name, lines)  # type: ignore[attr-defined]
        except SinkFailure as exc:
            self._fail(state, name, str(exc), attempt, url, in_gate=False)
            return
        finally:
            chunks.clear()
            lines.clear()
            self.free.append(handle)
        self.not_modified += 1
        self._stored(state, 0)
