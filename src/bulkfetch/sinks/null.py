"""Discards bodies after verification: measures listing and transport alone."""

from __future__ import annotations


class NullSink:
    def write(self, name: str, body: bytes) -> None:
        pass

    def commit_page(self) -> None:
        pass

    def close(self) -> None:
        pass
