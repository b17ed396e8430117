"""The server's outer ceiling: `wrk -t1 -c64` against one file, as in the standard setup of
docs/guide/benchmarks.md. One URL overstates what the server does for distinct files, so it
is an upper bound, not a target."""

from __future__ import annotations

import re
from dataclasses import dataclass

CONNECTIONS = 64

_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    errors: int  # non-2xx/3xx answers and socket errors

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def command(url: str, seconds: float) -> list[str]:
    return ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s",
            "--timeout", "10s", url]


def parse(text: str) -> WrkResult:
    """wrk's summary: 'N requests in T', 'Non-2xx or 3xx responses: E', 'Socket errors: ...'."""
    done = re.search(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h)", text, re.MULTILINE)
    if done is None:
        raise ValueError(f"no request count in wrk's output: {text.strip()[-300:]!r}")
    errors = 0
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    if non_2xx:
        errors += int(non_2xx.group(1))
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                        text)
    if sockets:
        errors += sum(int(v) for v in sockets.groups())
    return WrkResult(int(done.group(1)), float(done.group(2)) * _SECONDS[done.group(3)], errors)
