"""The Sink protocol and its two kinds of error."""

from __future__ import annotations

from typing import Protocol


class SinkFailure(Exception):
    """This one file cannot be stored (the run goes on); the message is the reason."""


class SinkFatal(Exception):
    """Nothing more can be stored (disk full, read-only, I/O error): the run must stop."""


class Sink(Protocol):
    def write(self, name: str, body: bytes) -> None:
        """Store a complete, verified body under `name` (already checked by check_name).
        The file appears under its final name only once fully written."""
        ...

    def commit_page(self) -> None:
        """Everything written so far is durable enough for the journal to mark it done."""
        ...

    def close(self) -> None: ...
