"""Discards bodies after verification: measures listing and transport alone."""

from __future__ import annotations

from collections.abc import Sequence

from bulkfetch.models import PageReport
from bulkfetch.sinks.base import SinkAbilities, Writer
from bulkfetch.sinks.spool import NullSpool


def _discard(name: str, body: bytes, md5: str | None) -> None:
    pass


class NullSink:
    abilities = SinkAbilities(keeps=False)
    needs_md5 = False

    def begin_page(self, seq: int, names: Sequence[str] = ()) -> Writer:
        return _discard

    def skip(self, seq: int, name: str) -> None:
        pass

    def open_spool(self, name: str) -> NullSpool:
        return NullSpool()

    def open_partial(self, key: str) -> None:
        return None

    def store_spool(self, seq: int, name: str, spool: NullSpool, size: int, md5: str) -> None:
        pass

    def end_page(self, report: PageReport) -> list[PageReport]:
        return [report]

    def ready(self) -> list[PageReport]:
        return []

    def flush(self) -> list[PageReport]:
        return []

    def close(self) -> None:
        pass
