"""Running the server: sockets, one event loop per process (SO_REUSEPORT), clean signals."""

from __future__ import annotations

import asyncio
import ipaddress
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import TextIO
from urllib.parse import quote

from bulkfetch.server.faults import Attempts, Fault, SharedAttempts
from bulkfetch.server.http import (
    AccessLog,
    Handler,
    HttpConnection,
    LimitedHttpConnection,
    PacedHttpConnection,
    PacedLimitedHttpConnection,
)
from bulkfetch.server.limits import Limits
from bulkfetch.server.options import ServeOptions, build_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _require_free(host: str, port: int) -> None:
    """OSError EADDRINUSE when something listens on `port` already. SO_REUSEPORT (which the
    server's own processes need, to share the port) would otherwise let this server bind
    beside another one of the same user, and the kernel would split the connections
    between two servers without a word."""
    with _bound(host, port, share=False):  # (SO_REUSEADDR: a port in TIME_WAIT is free)
        pass


def _bind(host: str, port: int) -> socket.socket:
    return _bound(host, port, share=True)


def _bound(host: str, port: int, *, share: bool) -> socket.socket:
    """A TCP socket bound to `port`; `share`: with SO_REUSEPORT, for this server's
    processes."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if share:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def log_host(host: str | None) -> str:
    """The Host header as one access-log field: '-' when absent or empty, else
    percent-encoded (spaces, '%' and control bytes never reach the log as such)."""
    if not host:
        return "-"
    return "%2D" if host == "-" else quote(host, safe=":[]@!$&'()*+,;=")


def _access_logger(target: str | None) -> AccessLog | None:
    """One line a request: TIME PID METHOD TARGET STATUS LENGTH FAULT AUTH HOST, where AUTH
    is yes/no (an Authorization header was sent; its value is never logged) and HOST is the
    Host header (log_host)."""
    if target is None:
        return None
    stream: TextIO = sys.stderr if target == "-" else open(target, "a", buffering=1)  # noqa: SIM115
    pid = os.getpid()

    def log(method: str, path: str, status: int, length: int, fault: Fault,
            authorization: bool, host: str | None) -> None:
        stream.write(f"{time.time():.3f} {pid} {method} {path} {status} {length} {fault.value} "
                     f"{'yes' if authorization else 'no'} {log_host(host)}\n")

    return log


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _factory(app: Handler, log: AccessLog | None, rate: int,
             limits: Limits | None) -> Callable[[], HttpConnection]:
    """What makes each connection: only a limited server pays for pacing or limits, the plain
    class otherwise."""
    if limits is not None:
        if rate > 0:
            return lambda: PacedLimitedHttpConnection(app, log, limits, rate=rate)
        return lambda: LimitedHttpConnection(app, log, limits)
    if rate > 0:
        return lambda: PacedHttpConnection(app, log, rate)
    return lambda: HttpConnection(app, log)


def _serve_socket(options: ServeOptions, sock: socket.socket, ready: Callable[[], None],
                  attempts: Attempts | None = None, limits: Limits | None = None) -> None:
    """Serve on `sock` in this process until SIGINT or SIGTERM."""
    app = build_app(options, port=sock.getsockname()[1], attempts=attempts)
    log = _access_logger(options.access_log)
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    stop = loop.create_future()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: stop.done() or stop.set_result(None))

    factory = _factory(app, log, options.bandwidth_per_connection, limits)

    async def main() -> None:
        server = await loop.create_server(factory, sock=sock, backlog=4096)
        ready()
        await stop
        server.close()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def _child(options: ServeOptions, port: int, ready: multiprocessing.synchronize.Event,
           attempts: Attempts | None, limits: Limits | None) -> None:
    _serve_socket(options, _bind(options.host, port), ready.set, attempts, limits)


def serve(options: ServeOptions, announce: Callable[[str], None]) -> int:
    """Bind, start serving, call `announce("serving http://...")`, serve until a signal."""
    if options.port:
        _require_free(options.host, options.port)
    reservation = _bind(options.host, options.port)
    port = reservation.getsockname()[1]
    host = f"[{options.host}]" if ":" in options.host else options.host
    line = f"serving http://{host}:{port} ({options.describe()}; {options.processes} process"
    line += "es)" if options.processes > 1 else ")"
    if options.s3_bucket is not None:
        signed = "signed requests only" if options.s3_credentials else "any request"
        line += (f"; S3: s3://{options.s3_bucket}/ with --endpoint-url http://{host}:{port} "
                 f"(path style, {signed})")
    if options.shape != "seed":
        from bulkfetch.server.shapes import LISTING_PATHS

        line += f"; {options.shape}: http://{host}:{port}{LISTING_PATHS[options.shape]}"
    if options.bearer_token is not None:  # said, never shown
        line += "; a bearer token required"
    if options.redirect_files_to is not None:
        line += f"; files redirected to {options.redirect_files_to}"
    # --max-concurrent, --max-rps: counted in memory every process shares (made before forking)
    limits = Limits.create(options.max_concurrent, options.max_rps)
    if options.processes == 1:
        _serve_socket(options, reservation, lambda: announce(line), limits=limits)
        return 0
    context = multiprocessing.get_context("fork")
    events = [context.Event() for _ in range(options.processes)]
    # A retry may reach any process: they count attempts in one table (made before the fork)
    attempts = SharedAttempts() if options.faults.active else None
    children = [
        context.Process(target=_child, args=(options, port, event, attempts, limits), daemon=True)
        for event in events
    ]
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for child in children:
            child.start()
        deadline = time.monotonic() + 30
        for event in events:
            if not event.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError("a server process did not start within 30 s")
        reservation.close()
        announce(line)
        sentinels = [child.sentinel for child in children]
        while not stopping:
            if multiprocessing.connection.wait(sentinels, timeout=0.2):
                for child in children:
                    child.join(0.5)
                if all(child.exitcode == 0 for child in children if not child.is_alive()):
                    return 0  # stopped by a signal to the whole group (Ctrl-C, timeout)
                print("bulkfetch serve: a server process died; stopping", file=sys.stderr)
                return 1
        return 0
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
        for child in children:
            child.join(5)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
