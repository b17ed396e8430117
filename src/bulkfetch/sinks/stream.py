"""The sink of `bulkfetch.stream()`: a worker's bodies go up to the caller's process.

A page's bodies travel as one message (its names NUL-joined, their sizes, one buffer of
the bodies end to end): one pickle and one pipe write for a few hundred files, so crossing
the process boundary costs about a copy of the bytes. The `one_by_one` kind sends each
body as its own message, the usual multiprocessing design; it exists to be measured
against (benchmarks/stream.py), never chosen by default.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from bulkfetch.models import PageReport
from bulkfetch.sinks.base import SinkAbilities, Writer
from bulkfetch.sinks.null import NullSink
from bulkfetch.sinks.spool import MemorySpool


class _PageBodies:
    __slots__ = ("bodies", "names", "sizes")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.sizes = array("Q")
        self.bodies: list[bytes] = []

    def write(self, name: str, body: bytes, md5: str | None) -> None:
        self.names.append(name)
        self.sizes.append(len(body))
        self.bodies.append(body)


class StreamSink(NullSink):
    """Sends ("bodies", seq, names, sizes, data) for each page, before the page's report,
    through `outbox` (the worker's results channel). Nothing is kept: a page is done once
    its bodies are sent, and a stream is not resumed."""

    abilities = SinkAbilities()  # kept by the caller, who takes each body as it comes

    def __init__(self, outbox: Any, one_by_one: bool = False) -> None:
        self.outbox = outbox
        self.one_by_one = one_by_one
        self.pages: dict[int, _PageBodies] = {}

    def begin_page(self, seq: int, names: Sequence[str] = ()) -> Writer:
        if self.one_by_one:
            return self._send_one
        page = self.pages[seq] = _PageBodies()
        return page.write

    def _send_one(self, name: str, body: bytes, md5: str | None) -> None:
        self.outbox.put(("body", name, body))

    def open_spool(self, name: str) -> MemorySpool:  # type: ignore[override]
        return MemorySpool()

    def store_spool(self, seq: int, name: str, spool: MemorySpool,  # type: ignore[override]
                    size: int, md5: str) -> None:
        body = spool.body()
        spool.discard()
        if self.one_by_one:
            self._send_one(name, body, md5)
        else:
            self.pages[seq].write(name, body, md5)

    def end_page(self, report: PageReport) -> list[PageReport]:
        page = self.pages.pop(report.seq, None)
        if page is not None and page.names:
            names = "\0".join(page.names)  # names passed check_name: none holds a NUL
            self.outbox.put(("bodies", report.seq, names, page.sizes.tobytes(),
                             b"".join(page.bodies)))
        return [report]
