"""Pages whose requests are conditional (Page.headers): a Client's disk cache and get --sync
ask with If-None-Match / If-Modified-Since. A 200's header lines go to the sink before its
body (it keeps them: Cache-Control, ETag ...), and a 304 is the sink's to answer from what
it kept: a 304 has no body, so none of a 200's checks apply to it.

The fetcher switches to this at the first such page; a run of other pages never pays for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pycurl

from bulkfetch.engine.pages import PageState
from bulkfetch.engine.transfers import Transfers
from bulkfetch.sinks.base import ComparesBodies, ConditionalSink, SinkFailure

# A request header with nothing after the colon is not sent (libcurl): the headers of an
# unconditional request on a handle that may have made a conditional one.
_UNCONDITIONAL = ["If-None-Match:", "If-Modified-Since:"]

Completed = Callable[[pycurl.Curl, "tuple[int, str] | None"], None]


class ConditionalPages:
    def __init__(self, transfers: Transfers, completed: Completed,
                 spooling: dict[pycurl.Curl, Any]) -> None:
        """`completed`: what ends any other transfer (the fetcher's); `spooling`: the big
        bodies' handles in flight (a 304 there is theirs to judge)."""
        sink = transfers.sink
        if not isinstance(sink, ConditionalSink):
            raise TypeError("a page with request headers needs a sink with "
                            f"response_headers() and not_modified(), not {type(sink).__name__}")
        self.sink: ConditionalSink = sink
        self.transfers = transfers
        self.completed_otherwise = completed
        self.spooling = spooling
        self.not_modified = 0  # 304s to conditional requests (each counts as stored)
        # a sink that leaves a 200's body equal to its copy as it is, to count those
        self.compares = sink if isinstance(sink, ComparesBodies) else None
        transfers.request_headers = self.headers

    @property
    def same_bodies(self) -> int:
        """200s to conditional requests whose body was the sink's copy (the server ignores
        conditional requests)."""
        return self.compares.same_bodies if self.compares is not None else 0

    def add(self, state: PageState, names: Sequence[str], headers: tuple[str, ...]) -> None:
        """A cache's page: its items' request headers kept by name."""
        state.headers = {name: lines.split("\n")
                         for name, lines in zip(names, headers, strict=True) if lines}

    def headers(self, transfer: Any) -> list[str]:
        """Every transfer's headers once a conditional page came: the source's (signed, if
        it signs) and the item's own. Set on every transfer, so no handle keeps another
        transfer's If-None-Match."""
        transfers = self.transfers
        sign = transfers.sign
        base = sign(transfer[2]) if sign is not None else transfers.base_headers
        extra = transfer[0].headers
        more = extra.get(transfer[1]) if extra else None
        # (an empty list would leave the handle's last list in place: pycurl sets none)
        return base + more if more else base or _UNCONDITIONAL

    def completed(self, handle: pycurl.Curl, error: tuple[int, str] | None) -> None:
        """A transfer ended. For a conditional page's items, a 200's header lines go to the
        sink first, and a 304 to a conditional request is answered by the sink; everything
        else as any transfer's end."""
        transfer = self.transfers.transfer_of[handle]
        extra = transfer[0].headers
        if error is None and extra is not None:
            status = handle.getinfo(pycurl.RESPONSE_CODE)
            if status == 200:
                self.sink.response_headers(transfer[1], self.transfers.buffers[handle][1])
            elif status == 304 and transfer[1] in extra and handle not in self.spooling:
                self._not_modified(handle, transfer)
                return
        self.completed_otherwise(handle, error)

    def _not_modified(self, handle: pycurl.Curl, transfer: Any) -> None:
        """The sink answers the item from what it kept (sink.not_modified); the item counts
        as stored, with no bytes transferred."""
        transfers = self.transfers
        state, name, url, attempt = transfer
        transfers.multi.remove_handle(handle)
        gate = transfers.gate
        if transfers.windows is not None:
            gate.done(url)  # type: ignore[union-attr]
        if gate is not None:
            gate.ended(url)  # (no body: the host's body size learns nothing)
        chunks, lines = transfers.buffers[handle]
        try:
            self.sink.not_modified(name, lines)
        except SinkFailure as exc:
            transfers.fail(state, name, str(exc), attempt, url, in_gate=False)
            return
        finally:
            chunks.clear()
            lines.clear()
            transfers.free.append(handle)
        self.not_modified += 1
        transfers.pages.stored(state, 0)
