"""Discards bodies after verification: measures listing and transport alone."""

from __future__ import annotations

from bulkfetch.models import PageReport
from bulkfetch.sinks.base import Writer


def _discard(name: str, body: bytes, md5: str | None) -> None:
    pass


class NullSink:
    def begin_page(self, seq: int) -> Writer:
        return _discard

    def end_page(self, report: PageReport) -> list[PageReport]:
        return [report]

    def ready(self) -> list[PageReport]:
        return []

    def flush(self) -> list[PageReport]:
        return []

    def close(self) -> None:
        pass
