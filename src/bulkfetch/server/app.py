"""The seed API over a DataSet: request in, Response out. No sockets here."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from typing import Literal
from urllib.parse import parse_qsl, unquote_to_bytes

from bulkfetch.server.dataset import DataSet, Entry
from bulkfetch.server.faults import NO_FAULT, Decision, Fault, FaultPlan
from bulkfetch.server.hostile import as_answer
from bulkfetch.server.tokens import BadToken, TokenCodec

JSON = "application/json"
MARKER_PARAM = "next-marker"
# Fixed error bodies, so the nginx export can answer byte-for-byte the same.
BAD_TOKEN_BODY = b'{"error":"invalid or forged next-marker token"}\n'
NOT_FOUND_BODY = b'{"error":"no such file"}\n'


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


def _error(status: int, message: str, extra: list[tuple[str, str]] | None = None) -> Response:
    body = json.dumps({"error": message}, separators=(",", ":")).encode() + b"\n"
    return Response(status, [("Content-Type", JSON), *(extra or [])], body)


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
    ) -> None:
        self.dataset = dataset
        self.tokens = TokenCodec(dataset.identity)
        self.faults = faults
        self.show_total = show_total

    def handle(self, method: str, target: str, headers: dict[str, str]) -> Response:
        if method not in ("GET", "HEAD"):
            return _error(405, f"method {method} not allowed", [("Allow", "GET, HEAD")])
        path, _, query = target.partition("?")
        if path == "/list":
            decision = self._decide(target, corruptible=False)
            response = self._list(query)
        elif path.startswith("/get/"):
            decision = self._decide(target, corruptible=method == "GET")
            response = self._get(path[5:], method, headers)
        else:
            return Response(404, [("Content-Type", JSON)], NOT_FOUND_BODY)
        return self._apply(decision, response)

    # -- faults --------------------------------------------------------------------------
    def _decide(self, target: str, corruptible: bool) -> Decision:
        return self.faults.decide(target, corruptible) if self.faults else NO_FAULT

    def _apply(self, decision: Decision, response: Response) -> Response:
        fault = decision.fault
        response.delay_s = decision.delay_s
        if fault is Fault.NONE:
            return response
        if fault is Fault.FAIL:
            status = 503 if decision.alternate else 500
            failed = _error(status, "injected server error")
            failed.delay_s, failed.fault = decision.delay_s, fault
            return failed
        if fault is Fault.THROTTLE:
            assert self.faults is not None
            wait = self.faults.config.retry_after
            value = http_date(math.ceil(time.time()) + wait) if decision.alternate else str(wait)
            throttled = _error(429, "slow down (injected)", [("Retry-After", value)])
            throttled.delay_s, throttled.fault = decision.delay_s, fault
            return throttled
        has_body = response.content_length > 0 and response.status in (200, 206)
        if fault is Fault.CORRUPT:
            if has_body:
                _corrupt(response)
                response.fault = fault  # for the access log; the bytes are already wrong
            return response
        if fault is Fault.TRUNCATE and not has_body:
            return response
        response.fault = fault  # STALL, RESET, TRUNCATE: carried out by the connection
        return response

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
        body = render_page(answer.names, token)
        if answer.malformed:
            body = body[: len(body) // 2]
        headers = [("Content-Type", answer.content_type)]
        if self.show_total and self.dataset.total is not None:
            headers.append(("X-Total-Files", str(self.dataset.total)))
        return Response(200, headers, body)

    def _get(self, quoted_name: str, method: str, headers: dict[str, str]) -> Response:
        try:
            name = unquote_to_bytes(quoted_name).decode("utf-8")
        except UnicodeDecodeError:
            return Response(404, [("Content-Type", JSON)], NOT_FOUND_BODY)
        entry = self.dataset.lookup(name)
        if entry is None:
            return Response(404, [("Content-Type", JSON)], NOT_FOUND_BODY)
        etag = entry.etag()
        common = [("ETag", etag), ("Last-Modified", http_date(entry.last_modified))]
        if _not_modified(headers, etag, entry.last_modified):
            return Response(304, common)
        start, stop, status = 0, entry.size, 200
        range_header = headers.get("range")
        # If-Range takes one validator, compared strongly (RFC 9110 13.1.5): no W/, *, lists
        if range_header is not None and headers.get("if-range", etag).strip() == etag:
            chosen = parse_range(range_header, entry.size)
            if chosen is False:
                return Response(
                    416, [*common, ("Content-Range", f"bytes */{entry.size}")], b""
                )
            if chosen is not None:
                start, stop = chosen
                status = 206
                common.append(("Content-Range", f"bytes {start}-{stop - 1}/{entry.size}"))
        out = [("Content-Type", "application/octet-stream"), ("Accept-Ranges", "bytes"), *common]
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
