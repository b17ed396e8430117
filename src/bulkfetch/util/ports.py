"""A port nothing listens on yet, for a server started next (tests, benchmarks, the
reference server's nginx export). Another process may take it first: callers that cannot
bear that bind port 0 themselves."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
