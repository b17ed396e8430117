"""A small, fast HTTP/1.1 connection handler (asyncio Protocol) for the reference server.

It speaks just what the seed API needs: GET and HEAD, keep-alive, pipelining, streamed large
bodies under flow control, and the faults that must happen on the wire (stall, reset,
truncate, trickle, overlong)."""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Protocol

from bulkfetch.server.app import OVERLONG_TAIL, Response, http_date
from bulkfetch.server.faults import Fault
from bulkfetch.server.limits import Limits

MAX_HEAD = 64 * 1024
# method, target, status, Content-Length, fault, Authorization sent?, Host header (or None)
AccessLog = Callable[[str, str, int, int, Fault, bool, str | None], None]

_REASONS = {status.value: status.phrase for status in HTTPStatus}


class _Clock:
    """The Date header, formatted once a second rather than once a response."""

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def date(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, http_date(now)
        return self._value


_clock = _Clock()


class Handler(Protocol):
    """What answers requests: the seed API's App, or S3App around it."""

    trickle_interval: float

    def handle(self, method: str, target: str, headers: dict[str, str]) -> Response: ...

    def refuse(self, fault: Fault, target: str) -> Response:
        """The answer to a request --max-concurrent or --max-rps turned away."""
        ...


class HttpConnection(asyncio.Protocol):
    def __init__(self, app: Handler, access_log: AccessLog | None = None) -> None:
        self.app = app
        self.access_log = access_log
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False  # a response is being delayed, streamed or withheld
        self.processing = False  # inside _process: answers finished there must not recurse
        self.closing = False
        self.write_paused = False
        self.streaming: Iterator[bytes] | None = None
        self.stream_keep_alive = True
        self.trickle: asyncio.TimerHandle | None = None  # next byte of a trickled body

    # -- asyncio callbacks ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.streaming = None
        if self.trickle is not None:
            self.trickle.cancel()
            self.trickle = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._process()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.streaming is not None:
            self._pump()

    # -- requests -------------------------------------------------------------------------
    def _process(self) -> None:
        if self.processing:  # _finish of an answer sent from this loop: the loop goes on
            return
        self.processing = True
        try:
            while not self.busy and not self.closing:
                if self.buffer[:1] and not self.buffer[:1].isalpha():
                    # Not HTTP (a TLS ClientHello from an https:// URL): answered at once, as
                    # nginx does, not left to the client's timeout
                    self._plain_error(400, "not an HTTP request")
                    return
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buffer) > MAX_HEAD:
                        self._plain_error(431, "request head too large")
                    return
                head = bytes(self.buffer[:end])
                del self.buffer[: end + 4]
                self._one(head)
        finally:
            self.processing = False

    def _one(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._plain_error(400, "malformed request line")
            return
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            self._plain_error(400, "request bodies are not accepted")
            return
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        response = self.app.handle(method, target, headers)
        if self.access_log is not None:
            self.access_log(method, target, response.status, response.content_length,
                            response.fault, "authorization" in headers, headers.get("host"))
        if response.delay_s > 0:
            self.busy = True
            asyncio.get_running_loop().call_later(
                response.delay_s, self._send, response, keep_alive, method == "HEAD"
            )
        else:
            self._send(response, keep_alive, method == "HEAD")

    # -- responses ------------------------------------------------------------------------
    def _send(self, response: Response, keep_alive: bool, head_only: bool) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        if response.fault is Fault.STALL:
            self.busy = True  # never answer, never read on; the client has to give up
            return
        if response.fault is Fault.RESET:
            self._reset()
            return
        length = response.content_length
        lines = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}",
            f"Date: {_clock.date()}",
            f"Content-Length: {length}",
        ]
        lines.extend(f"{k}: {v}" for k, v in response.headers)
        if not keep_alive:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if head_only or response.status in (204, 304):
            transport.write(head)
        elif response.fault is Fault.TRUNCATE:
            body = response.body if response.chunks is None else next(response.chunks, b"")
            transport.write(head + body[: max(0, min(len(body), length) // 2)])
            self._close()
            return
        elif response.fault is Fault.TRICKLE:
            transport.write(head)
            self.busy = True
            chunks = iter([response.body]) if response.chunks is None else response.chunks
            self._schedule_trickle(chunks, b"", 0, keep_alive)
            return
        elif response.fault is Fault.OVERLONG:  # the announced bytes, garbage, then close
            if response.chunks is None:
                transport.write(head + response.body + OVERLONG_TAIL)
                self._close()
                return
            transport.write(head)
            self._stream(itertools.chain(response.chunks, [OVERLONG_TAIL]), keep_alive=False)
            return
        elif response.chunks is not None:
            transport.write(head)
            self._stream(response.chunks, keep_alive)
            return
        else:
            transport.write(head + response.body)
        self._finish(keep_alive)

    def _stream(self, chunks: Iterator[bytes], keep_alive: bool) -> None:
        self.busy = True
        self.streaming = chunks
        self.stream_keep_alive = keep_alive
        self._pump()

    def _pump(self) -> None:
        assert self.transport is not None
        while self.streaming is not None and not self.write_paused:
            chunk = next(self.streaming, None)
            if chunk is None:
                self.streaming = None
                self._finish(self.stream_keep_alive)
                return
            self.transport.write(chunk)

    def _schedule_trickle(self, chunks: Iterator[bytes], chunk: bytes, offset: int,
                          keep_alive: bool) -> None:
        self.trickle = asyncio.get_running_loop().call_later(
            self.app.trickle_interval, self._trickle_byte, chunks, chunk, offset, keep_alive
        )

    def _trickle_byte(self, chunks: Iterator[bytes], chunk: bytes, offset: int,
                      keep_alive: bool) -> None:
        """One byte of the body now, the next one an interval later: a timer, never a sleep,
        so the loop serves everyone else meanwhile. Ends when the client goes away."""
        self.trickle = None
        if self.closing or self.transport is None:
            return
        if offset >= len(chunk):
            chunk, offset = next((c for c in chunks if c), b""), 0
        if chunk:
            self.transport.write(chunk[offset : offset + 1])
            offset += 1
            if offset >= len(chunk):  # was that the last byte of the body?
                chunk, offset = next((c for c in chunks if c), b""), 0
        if not chunk:
            self._finish(keep_alive)
            return
        self._schedule_trickle(chunks, chunk, offset, keep_alive)

    def _finish(self, keep_alive: bool) -> None:
        if not keep_alive:
            self._close()
            return
        self.busy = False
        if self.buffer:
            self._process()

    def _plain_error(self, status: int, message: str) -> None:
        body = f'{{"error":"{message}"}}\n'.encode()
        self._send(
            Response(status, [("Content-Type", "application/json")], body),
            keep_alive=False,
            head_only=False,
        )

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def _reset(self) -> None:
        self.closing = True
        assert self.transport is not None
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


PACE_TICK = 0.01  # --bandwidth-per-connection: pieces of about 10 ms worth of bytes...
PACE_PIECE = 65536  # ...and at most 64 KiB
_MIN_SLEEP = 0.001  # timers are milliseconds in libuv: a shorter sleep would spin


class PacedHttpConnection(HttpConnection):
    """An HttpConnection that sends body bytes at no more than `rate` bytes a second
    (--bandwidth-per-connection): a token bucket kept as `due`, the loop time by which the body
    bytes sent so far may have gone out at `rate`. A piece goes out when it is due, else a
    timer waits for it; idle time is saved up for one tick at most, so bursts stay small and
    the average holds. Heads are not paced. A subclass, so that an unlimited server runs the
    plain class with no cost at all."""

    def __init__(self, app: Handler, access_log: AccessLog | None = None, rate: int = 0) -> None:
        super().__init__(app, access_log)
        if rate <= 0:
            raise ValueError(f"rate must be > 0 bytes/s, got {rate}")
        self.rate = float(rate)
        self.piece = max(1, min(PACE_PIECE, int(rate * PACE_TICK)))
        self.due = 0.0
        self.pending = b""  # the rest of a chunk larger than a piece
        self.pace_timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.loop = asyncio.get_running_loop()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.pending = b""
        if self.pace_timer is not None:
            self.pace_timer.cancel()
            self.pace_timer = None

    def _send(self, response: Response, keep_alive: bool, head_only: bool) -> None:
        # A body sent whole is streamed as one chunk instead, so it is paced too; every fault
        # treats one chunk just as it treats a whole body.
        if response.chunks is None and len(response.body) > self.piece and not head_only:
            response.length = len(response.body)
            response.chunks = iter((response.body,))
            response.body = b""
        super()._send(response, keep_alive, head_only)

    def _pump(self) -> None:
        transport, loop = self.transport, self.loop
        assert transport is not None and loop is not None
        if self.pace_timer is not None:  # the timer goes on when it is time
            return
        now = loop.time()
        self.due = max(self.due, now - PACE_TICK)
        while self.streaming is not None and not self.write_paused:
            if self.due > now:
                self.pace_timer = loop.call_later(max(self.due - now, _MIN_SLEEP), self._tick)
                return
            chunk = self.pending or next(self.streaming, None)
            if chunk is None:
                self.streaming = None
                self._finish(self.stream_keep_alive)
                return
            if len(chunk) > self.piece:
                chunk, self.pending = chunk[: self.piece], chunk[self.piece :]
            else:
                self.pending = b""
            transport.write(chunk)
            self.due += len(chunk) / self.rate

    def _tick(self) -> None:
        self.pace_timer = None
        if not self.closing and self.transport is not None:
            self._pump()


class _Gate:
    """The handler a LimitedHttpConnection calls: asks the limits first, then answers the
    request (marking the connection as holding a permit) or refuses it at once."""

    __slots__ = ("app", "connection", "limits", "trickle_interval")

    def __init__(self, app: Handler, connection: LimitedHttpConnection, limits: Limits) -> None:
        self.app = app
        self.connection = connection
        self.limits = limits
        self.trickle_interval = app.trickle_interval

    def handle(self, method: str, target: str, headers: dict[str, str]) -> Response:
        fault = self.limits.admit()
        if fault is not Fault.NONE:
            return self.app.refuse(fault, target)
        self.connection.held = self.limits.holds
        return self.app.handle(method, target, headers)

    def refuse(self, fault: Fault, target: str) -> Response:
        return self.app.refuse(fault, target)


class LimitedHttpConnection(HttpConnection):
    """An HttpConnection under --max-concurrent / --max-rps (limits.py). A request is in
    flight, holding one of the shared permits, from its parsed head until its answer is fully
    written (delays of --latency included, a stalled answer until the client goes away) or
    its connection ends; one over a limit is answered at once by the app's refuse(). A
    subclass, so that an unlimited server runs the plain class with no cost at all."""

    def __init__(self, app: Handler, access_log: AccessLog | None = None,
                 limits: Limits | None = None, **kwargs: int) -> None:
        super().__init__(app, access_log, **kwargs)  # type: ignore[call-arg]  # rate=, paced
        if limits is None:
            raise ValueError("LimitedHttpConnection needs the server's Limits")
        self.limits = limits
        self.held = False  # this connection's request holds a permit
        self.app = _Gate(app, self, limits)

    def _release(self) -> None:
        if self.held:
            self.held = False
            self.limits.release()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        super().connection_lost(exc)

    def _finish(self, keep_alive: bool) -> None:
        self._release()  # before the next pipelined request asks for a permit
        super()._finish(keep_alive)

    def _close(self) -> None:
        self._release()
        super()._close()

    def _reset(self) -> None:
        self._release()
        super()._reset()


class PacedLimitedHttpConnection(LimitedHttpConnection, PacedHttpConnection):
    """--bandwidth-per-connection and a limit together: PacedLimitedHttpConnection(app, log,
    limits, rate=RATE)."""
