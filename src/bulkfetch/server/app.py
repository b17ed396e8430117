"""The seed API over a DataSet: request in, Response out. No sockets here."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import random
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from typing import Literal
from urllib.parse import parse_qsl, unquote_to_bytes

from bulkfetch.server.dataset import DataSet, Entry
from bulkfetch.server.faults import NO_FAULT, Decision, Fault, FaultPlan
from bulkfetch.server.hostile import HugeFirstPage, as_answer
from bulkfetch.server.tokens import BadToken, TokenCodec

JSON = "application/json"
MARKER_PARAM = "next-marker"
# Fixed error bodies, so the nginx export can answer byte-for-byte the same.
BAD_TOKEN_BODY = b'{"error":"invalid or forged next-marker token"}\n'
NOT_FOUND_BODY = b'{"error":"no such file"}\n'
# --overlong-rate: sent after the announced Content-Length bytes, before the server closes.
OVERLONG_TAIL = (b"<garbage past Content-Length, bulkfetch serve --overlong-rate>" + b"!" * 64)[:64]
REDIRECTED_PARAM = "redirected"  # --redirect-to relative adds redirected=1
FILE_REDIRECT = "file:///etc/passwd"
LATEST_HTTP_DATE = 253402300799  # Fri, 31 Dec 9999 23:59:59 GMT: four-digit years only
BOMB_ZEROS = 1 << 30  # --encoding-rate: the bomb decodes (twice) to 1 GiB of zeros


@dataclass(slots=True)
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    chunks: Iterator[bytes] | None = None  # large bodies, streamed; body is then empty
    length: int | None = None  # Content-Length when streaming
    fault: Fault = Fault.NONE
    delay_s: float = 0.0

    @property
    def content_length(self) -> int:
        return self.length if self.length is not None else len(self.body)


def render_page(names: list[str], next_token: str | None) -> bytes:
    """The exact bytes of a list page; the nginx export writes the same."""
    page: dict[str, object] = {"FileNames": names}
    if next_token is not None:
        page["NextMarker"] = next_token
    return json.dumps(page, separators=(",", ":")).encode("ascii") + b"\n"


def http_date(epoch: float) -> str:
    return formatdate(epoch, usegmt=True)


def retry_after_value(seconds: int, date_form: bool) -> str:
    """Retry-After in seconds, or as the HTTP-date that many seconds ahead (capped at the
    last date with a four-digit year, so an absurd --retry-after still gives a valid date).
    A date has whole seconds: "in 0 seconds" is this second's date, not the next one's,
    which would ask a polite client to hold the host for up to a second at every fault."""
    if not date_form:
        return str(seconds)
    now = time.time()
    return http_date(min(math.ceil(now) + seconds if seconds else math.floor(now),
                         LATEST_HTTP_DATE))


@functools.cache
def gzip_bomb() -> tuple[bytes, str]:
    """gzip(gzip(BOMB_ZEROS zeros)) and its quoted hex MD5, built once per process.

    The inner stream is one deflate segment (1 MiB of zeros, then a full flush, which resets
    the compressor) repeated: every segment compresses to the same bytes, so only the CRC has
    to pass over all the zeros. About 1 MiB inside, a few KiB on the wire."""
    zeros = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    segment = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    last_block = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    count = BOMB_ZEROS >> 20
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # gzip, deflate, mtime 0, max
    inner = (header + segment * count + last_block
             + struct.pack("<II", crc, BOMB_ZEROS & 0xFFFFFFFF))
    outer = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = outer.compress(inner) + outer.flush()
    return body, '"' + hashlib.md5(body).hexdigest() + '"'


def json_response(status: int, value: object, content_type: str = JSON,
                  extra: list[tuple[str, str]] | None = None) -> Response:
    """`value` as compact JSON (ASCII, one line) with its Content-Type and `extra` headers."""
    body = json.dumps(value, separators=(",", ":")).encode("ascii") + b"\n"
    return Response(status, [("Content-Type", content_type), *(extra or [])], body)


def _error(status: int, message: str, extra: list[tuple[str, str]] | None = None) -> Response:
    return json_response(status, {"error": message}, extra=extra)


def _parse_http_date(value: str) -> float | None:
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def parse_range(value: str, size: int) -> tuple[int, int] | Literal[False] | None:
    """A single 'bytes=' range -> (start, stop); None: ignore the header and serve the whole
    body (multi-range and invalid syntax, as RFC 9110 allows); False: unsatisfiable (416)."""
    unit, _, spec = value.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not (first + last).isascii() or not (first + last).isdigit():
        return None  # int() would also take '+5', '1_0', ' 5' and non-ASCII digits
    try:
        if not first:  # suffix form: the last N bytes
            count = int(last)
            return (max(0, size - count), size) if count > 0 and size > 0 else False
        start = int(first)
        stop = int(last) + 1 if last else size
    except ValueError:
        return None
    if start < 0 or (last and stop <= start):
        return None
    if start >= size:
        return False
    return (start, min(stop, size))


def repr_digest(sha256: bytes) -> str:
    """The Repr-Digest field value (RFC 9530) for a SHA-256: a structured-field dictionary
    whose byte-sequence member is base64 between colons."""
    return "sha-256=:" + base64.b64encode(sha256).decode("ascii") + ":"


def shifted_range(start: int, stop: int, size: int) -> tuple[int, int]:
    """--wrong-content-range: the range sent instead of [start, stop) of a `size`-byte body.
    The next range of the same length (cut at the end of the body); for a range that ends the
    body, the one before it; for the whole body, bytes 1 to the end. Only the single byte of
    a 1-byte body has no other range, and is sent as asked."""
    length = stop - start
    if stop < size:
        return stop, min(size, stop + length)
    if start > 0:
        return max(0, start - length), start
    if size > 1:
        return 1, size
    return start, stop


def _etag_matches(header: str, etag: str) -> bool:
    if header.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in header.split(","))


class App:
    def __init__(
        self,
        dataset: DataSet,
        faults: FaultPlan | None = None,
        show_total: bool = True,
        port: int = 0,
        digest_header: bool = False,
        ignore_ranges: bool = False,
        wrong_content_range: bool = False,
        list_latency_ms: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        self.dataset = dataset
        self.list_latency_ms = list_latency_ms  # added to every list page's delay
        self.digest_header = digest_header  # Repr-Digest on file answers (200, 206, HEAD)
        self.ignore_ranges = ignore_ranges  # Range is never honoured: 200, the whole body
        self.wrong_content_range = wrong_content_range  # 206s of another range (shifted_range)
        self.tokens = TokenCodec(dataset.identity)
        self.faults = faults
        self.show_total = show_total
        self.port = port  # where this server listens: --redirect-to other-host points there
        self.trickle_interval = faults.config.trickle_interval if faults else 1.0
        if faults is not None and faults.config.encoding_rate > 0:
            gzip_bomb()  # built before the first request rather than while answering it

    def handle(self, method: str, target: str, headers: dict[str, str]) -> Response:
        if method not in ("GET", "HEAD"):
            return _error(405, f"method {method} not allowed", [("Allow", "GET, HEAD")])
        path, _, query = target.partition("?")
        if path == "/list":
            return self.list_answer(method, target, headers, lambda: self._list(query))
        if path.startswith("/get/"):
            return self.file_answer(path[5:], method, target, headers)
        return Response(404, [("Content-Type", JSON)], NOT_FOUND_BODY)

    def list_answer(self, method: str, target: str, headers: dict[str, str],
                    build: Callable[[], Response]) -> Response:
        """A list page built by `build`, with the faults and --list-latency of list pages
        (the seed API's and S3's alike)."""
        decision = self._decide(target, corruptible=False, file=False)
        response = self._apply(decision, build(), method, target, headers)
        low, high = self.list_latency_ms
        if high > 0:
            response.delay_s += (low if low == high else random.uniform(low, high)) / 1000.0
        return response

    def file_answer(self, quoted_name: str, method: str, target: str,
                    headers: dict[str, str]) -> Response:
        """The file named by `quoted_name` (percent-encoded as it came), faults applied."""
        decision = self._decide(target, corruptible=method == "GET")
        denied = self.faults.denied(unquote_to_bytes(quoted_name)) if self.faults else None
        if denied is not None:
            return self._deny(denied, decision)
        return self._apply(decision, self._get(quoted_name, method, headers), method, target,
                           headers)

    def refuse(self, fault: Fault, target: str) -> Response:
        """The answer to a request --max-concurrent (Fault.OVERLOAD: 503) or --max-rps
        (Fault.RATE: 429) turned away before it was handled, with Retry-After: 1."""
        if fault is Fault.OVERLOAD:
            refused = _error(503, "too many requests in flight (--max-concurrent)",
                             [("Retry-After", "1")])
        else:
            refused = _error(429, "too many requests a second (--max-rps)",
                             [("Retry-After", "1")])
        refused.fault = fault
        return refused

    # -- faults --------------------------------------------------------------------------
    def _decide(self, target: str, corruptible: bool, file: bool = True) -> Decision:
        return self.faults.decide(target, corruptible, file) if self.faults else NO_FAULT

    def _deny(self, status: int, decision: Decision) -> Response:
        extra = [("WWW-Authenticate", 'Basic realm="bulkfetch"')] if status == 401 else []
        denied = _error(status, "denied (injected, permanent)", extra)
        denied.delay_s, denied.fault = decision.delay_s, Fault.DENY
        return denied

    def _apply(self, decision: Decision, response: Response, method: str = "GET",
               target: str = "", headers: dict[str, str] | None = None) -> Response:
        fault = decision.fault
        response.delay_s = decision.delay_s
        if fault is Fault.NONE:
            return response
        if fault is Fault.FAIL:
            extra = []
            if decision.alternate:  # 503: come back later, says Retry-After
                assert self.faults is not None
                extra.append(("Retry-After", retry_after_value(self.faults.config.retry_after,
                                                               decision.date_form)))
            failed = _error(503 if decision.alternate else 500, "injected server error", extra)
            failed.delay_s, failed.fault = decision.delay_s, fault
            return failed
        if fault is Fault.THROTTLE:
            assert self.faults is not None
            value = retry_after_value(self.faults.config.retry_after, decision.alternate)
            throttled = _error(429, "slow down (injected)", [("Retry-After", value)])
            throttled.delay_s, throttled.fault = decision.delay_s, fault
            return throttled
        if fault is Fault.REDIRECT:
            location = self._redirect_location(decision.redirect, target, headers or {})
            if location is None:  # arrived through a redirect already: served normally
                return response
            moved = _error(302, "moved (injected)", [("Location", location)])
            moved.delay_s, moved.fault = decision.delay_s, fault
            return moved
        if fault is Fault.STALL or fault is Fault.RESET:
            response.fault = fault  # carried out by the connection
            return response
        # The rest change the body: only for a GET answered with one.
        if not (method == "GET" and response.content_length > 0
                and response.status in (200, 206)):
            return response
        if fault is Fault.CORRUPT:
            _corrupt(response)
        elif fault is Fault.ENCODING:
            response = _bombed(response)
            response.delay_s = decision.delay_s
        # CORRUPT, ENCODING: the bytes are set, the fault is for the access log; TRUNCATE,
        # TRICKLE, OVERLONG: carried out by the connection.
        response.fault = fault
        return response

    def _redirect_location(self, kind: str, target: str, headers: dict[str, str]) -> str | None:
        """Where a REDIRECT decision sends `target`; None when the request came through a
        redirect already (Host localhost:PORT or redirected=1), except for `loop`."""
        if kind == "loop":
            return target
        _, mark, query = target.partition("?")
        arrived = (headers.get("host", "").lower() == f"localhost:{self.port}"
                   or (REDIRECTED_PARAM, "1") in parse_qsl(query, keep_blank_values=True))
        if arrived:
            return None
        if kind == "other-host":
            return f"http://localhost:{self.port}{target}"
        if kind == "file":
            return FILE_REDIRECT
        return f"{target}{'&' if mark else '?'}{REDIRECTED_PARAM}=1"  # relative

    # -- routes --------------------------------------------------------------------------
    def _list(self, query: str) -> Response:
        cursor = None
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key == MARKER_PARAM:
                try:
                    cursor = self.tokens.decode(value)
                except BadToken:
                    return Response(400, [("Content-Type", JSON)], BAD_TOKEN_BODY)
        try:
            answer = as_answer(self.dataset, cursor)
        except ValueError:
            return Response(400, [("Content-Type", JSON)], BAD_TOKEN_BODY)
        token = None if answer.next_cursor is None else self.tokens.encode(answer.next_cursor)
        headers = [("Content-Type", answer.content_type)]
        if self.show_total and self.dataset.total is not None:
            headers.append(("X-Total-Files", str(self.dataset.total)))
        if answer.huge:
            assert isinstance(self.dataset, HugeFirstPage)
            length, chunks = self.dataset.first_page(token)
            return Response(200, headers, chunks=chunks, length=length)
        body = render_page(answer.names, token)
        if answer.malformed:
            body = body[: len(body) // 2]
        return Response(200, headers, body)

    def _get(self, quoted_name: str, method: str, headers: dict[str, str]) -> Response:
        try:
            name = unquote_to_bytes(quoted_name).decode("utf-8")
        except UnicodeDecodeError:
            return Response(404, [("Content-Type", JSON)], NOT_FOUND_BODY)
        entry = self.dataset.lookup(name)
        if entry is None:
            return Response(404, [("Content-Type", JSON)], NOT_FOUND_BODY)
        # SHA-256 first: a large body's MD5 (the ETag) comes along in the same pass
        sha256 = entry.sha256() if self.digest_header else None
        etag = entry.etag()
        common = [("ETag", etag), ("Last-Modified", http_date(entry.last_modified))]
        if _not_modified(headers, etag, entry.last_modified):
            return Response(304, common)
        start, stop, status = 0, entry.size, 200
        # --ignore-ranges still advertises Accept-Ranges: bytes below, luring clients into it
        range_header = None if self.ignore_ranges else headers.get("range")
        # If-Range takes one validator, compared strongly (RFC 9110 13.1.5): no W/, *, lists
        if range_header is not None and headers.get("if-range", etag).strip() == etag:
            chosen = parse_range(range_header, entry.size)
            if chosen is False:
                return Response(
                    416, [*common, ("Content-Range", f"bytes */{entry.size}")], b""
                )
            if chosen is not None:
                start, stop = chosen
                if self.wrong_content_range:
                    start, stop = shifted_range(start, stop, entry.size)
                status = 206
                common.append(("Content-Range", f"bytes {start}-{stop - 1}/{entry.size}"))
        out = [("Content-Type", "application/octet-stream"), ("Accept-Ranges", "bytes"), *common]
        if sha256 is not None:  # of the whole representation, on a 206 too
            out.append(("Repr-Digest", repr_digest(sha256)))
        if method == "HEAD":
            return Response(status, out, length=stop - start)
        return _body_response(status, out, entry, start, stop)


def _not_modified(headers: dict[str, str], etag: str, last_modified: int) -> bool:
    if_none_match = headers.get("if-none-match")
    if if_none_match is not None:
        return _etag_matches(if_none_match, etag)
    since = headers.get("if-modified-since")
    if since is not None:
        stamp = _parse_http_date(since)
        return stamp is not None and last_modified <= stamp
    return False


def _body_response(
    status: int, headers: list[tuple[str, str]], entry: Entry, start: int, stop: int
) -> Response:
    if stop - start <= 1 << 20:
        return Response(status, headers, b"".join(entry.read(start, stop)))
    return Response(status, headers, chunks=entry.read(start, stop), length=stop - start)


def _bombed(response: Response) -> Response:
    """The gzip bomb in place of `response`'s body: Content-Length and ETag are those of the
    bytes sent; Range is ignored (200, whole bomb)."""
    body, etag = gzip_bomb()
    kept = [(k, v) for k, v in response.headers if k == "Last-Modified"]
    return Response(200, [("Content-Type", "application/octet-stream"),
                          ("Content-Encoding", "gzip, gzip"), ("ETag", etag), *kept], body)


def _corrupt(response: Response) -> None:
    """Flip every bit of one byte in the middle: same length, different MD5."""
    if response.chunks is None:
        body = bytearray(response.body)
        body[len(body) // 2] ^= 0xFF
        response.body = bytes(body)
        return
    original = response.chunks

    def flipped() -> Iterator[bytes]:
        first = True
        for chunk in original:
            if first and chunk:
                changed = bytearray(chunk)
                changed[0] ^= 0xFF
                chunk, first = bytes(changed), False
            yield chunk

    response.chunks = flipped()
