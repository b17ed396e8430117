"""The run's signals: the first SIGINT/SIGTERM stops it gracefully, the second at once; and
`say()`, a line on stderr that is safe inside a signal handler."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

_SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


def say(text: str) -> None:
    """A line on stderr from a signal handler: one write(2), no buffered stream, no lock."""
    with contextlib.suppress(OSError):
        os.write(2, text.encode("utf-8", "replace"))


class Interrupt:
    """First SIGINT/SIGTERM: stop gracefully, and say so at once. Second: `abort()`, which
    leaves at once (the journal is consistent at every commit, so a rerun resumes)."""

    def __init__(self, abort: Callable[[], None]) -> None:
        self.requested = False
        self.abort = abort
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            try:
                self.abort()
            finally:
                os._exit(130)
        self.requested = True
        again = "Press Ctrl-C again" if signum == signal.SIGINT else "Send it again"
        say(f"\nbulkfetch: {_SIGNAL_NAMES.get(signum, f'signal {signum}')} received: "
             f"stopping (no new files; transfers in flight finish or are dropped). {again} "
             "to quit at once. Rerun the same command to resume.\n")

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
