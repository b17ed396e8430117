"""One worker's transfers: a libcurl multi loop with reused handles, retries on a timer heap,
verification, and the sink. Pages go in; PageReports come out when every name of a page is
either stored or failed."""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import itertools
import random
import time
from collections import deque
from dataclasses import dataclass, field

import pycurl

from bulkfetch.config import GetOptions
from bulkfetch.engine.curl import (
    RETRYABLE_CURL_ERRORS,
    header_value,
    header_values,
    new_handle,
    retry_after_seconds,
    retryable_status,
)
from bulkfetch.models import Failure, Page, PageReport, Tick
from bulkfetch.names import check_name
from bulkfetch.sinks.base import Sink, SinkFailure, Writer
from bulkfetch.sources.base import Source

_HEX = frozenset("0123456789abcdef")


@dataclass(slots=True)
class _PageState:
    page: Page
    remaining: int
    write: Writer
    ok: int = 0
    bytes: int = 0
    failures: list[Failure] = field(default_factory=list)


# A transfer is a plain tuple (page state, name, url, attempt): building one per file must
# cost less than a Python-level __init__ call.
_Transfer = tuple[_PageState, str, str, int]


def expected_md5(etag: str | None, content_md5: str | None) -> str | None:
    """The body's MD5 as the server states it: a strong ETag of 32 hex digits (S3 and the
    seed API), or Content-MD5 (base64). None when the server states none."""
    if content_md5:
        try:
            return base64.b64decode(content_md5, validate=True).hex()
        except (binascii.Error, ValueError):
            return None
    if etag and not etag.startswith("W/"):
        tag = etag.strip('"').lower()
        if len(tag) == 32 and _HEX.issuperset(tag):
            return tag
    return None


def _mismatch(lines: list[bytes], digest: str) -> str | None:
    """Why a body with MD5 `digest` fails the server's stated checksum, or None when the
    server states none (or one that is not an MD5, such as a multipart S3 ETag)."""
    expected = expected_md5(*header_values(lines, b"etag", b"content-md5"))
    if expected is not None and expected != digest:
        return "MD5 of the body does not match the server's ETag/Content-MD5"
    return None


class Fetcher:
    def __init__(self, options: GetOptions, source: Source, sink: Sink, worker: int = 0,
                 rng: random.Random | None = None) -> None:
        self.options = options
        self.source = source
        self.sink = sink
        self.worker = worker
        self.verify = options.verify
        self.policy = options.retry
        self.rng = rng or random.Random()
        self.multi = pycurl.CurlMulti()
        if options.limits.per_host:
            self.multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, options.limits.per_host)
        self.free: list[pycurl.Curl] = []
        for _ in range(options.limits.concurrency):
            handle = new_handle(options.timeouts)
            handle.chunks = []
            handle.lines = []
            handle.setopt(pycurl.WRITEFUNCTION, handle.chunks.append)
            handle.setopt(pycurl.HEADERFUNCTION, handle.lines.append)
            handle.transfer = None
            self.free.append(handle)
        self.handles = list(self.free)
        self.in_flight = 0
        self.pending: deque[_Transfer] = deque()
        self.waiting: list[tuple[float, int, _Transfer]] = []  # retry heap by due time
        self.order = itertools.count()
        self.finished: list[PageReport] = []  # durable page reports, not yet taken
        self.fetched = 0  # pages whose every file is stored or failed, not yet taken
        self.pages_held = 0
        self.files_ok = self.files_failed = self.bytes = self.retries = 0

    # -- feeding -------------------------------------------------------------------------
    @property
    def wants_pages(self) -> bool:
        return len(self.pending) < self.options.limits.concurrency

    @property
    def idle(self) -> bool:
        return self.pages_held == 0

    def add_page(self, page: Page) -> None:
        state = _PageState(page, len(page.names), self.sink.begin_page(page.seq))
        self.pages_held += 1
        resolve, pending = self.source.resolve, self.pending
        for item in page.names:
            try:
                name, url = resolve(item)
            except UnicodeError:  # e.g. a lone surrogate from \udcff in the JSON
                self._fail(state, item, "unsafe name: name is not valid UTF-8", 0)
                continue
            except ValueError as exc:
                self._fail(state, item, str(exc), 0)
                continue
            reason = check_name(name)
            if reason is not None:
                self._fail(state, name, f"unsafe name: {reason}", 0)
                continue
            pending.append((state, name, url, 1))
        if state.remaining == 0:
            self._page_finished(state)

    # -- the loop ------------------------------------------------------------------------
    def step(self, timeout: float) -> list[PageReport]:
        """Start what can start, move transfers on, and return the page reports that became
        durable since (see take_fetched() for pages that finished fetching)."""
        if self.waiting:
            now = time.monotonic()
            while self.waiting and self.waiting[0][0] <= now:
                self.pending.append(heapq.heappop(self.waiting)[2])
        multi, free, pending = self.multi, self.free, self.pending
        while free and pending:
            transfer = pending.popleft()
            handle = free.pop()
            handle.transfer = transfer
            handle.setopt(pycurl.URL, transfer[2])
            multi.add_handle(handle)
            self.in_flight += 1
        if self.in_flight:
            while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            completed = self._completed
            while True:
                queued, succeeded, failed = multi.info_read()
                for handle in succeeded:
                    completed(handle, None)
                for handle, code, message in failed:
                    completed(handle, (code, message))
                if not queued:
                    break
            if self.in_flight and not (self.finished or self.fetched):
                multi.select(timeout)
        elif self.waiting and not (self.finished or self.fetched):
            time.sleep(min(timeout, max(0.0, self.waiting[0][0] - time.monotonic())))
        finished, self.finished = self.finished, []
        return finished

    def _completed(self, handle: pycurl.Curl, error: tuple[int, str] | None) -> None:
        """One transfer ended. The success path is written flat: it runs once per file."""
        self.multi.remove_handle(handle)
        self.in_flight -= 1
        transfer: _Transfer = handle.transfer
        handle.transfer = None
        chunks, lines = handle.chunks, handle.lines
        retry_after = None
        if error is not None:
            code, message = error
            retryable, reason = code in RETRYABLE_CURL_ERRORS, f"{message} (curl error {code})"
        elif handle.getinfo(pycurl.RESPONSE_CODE) == 200:
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            announced = handle.getinfo(pycurl.CONTENT_LENGTH_DOWNLOAD)
            if announced >= 0 and announced != len(body):
                reason = f"body of {len(body)} bytes, Content-Length {int(announced)}"
            elif not self.verify:
                reason = digest = None
            else:
                head = b"".join(lines)
                digest = hashlib.md5(body).hexdigest()
                # The common case costs one search: a strong ETag that is the body's MD5.
                if (b'ETag: "%s"' % digest.encode()) in head:
                    reason = None
                else:
                    reason = _mismatch(lines, digest)
            chunks.clear()
            lines.clear()
            self.free.append(handle)
            if reason is None:
                state = transfer[0]
                try:
                    state.write(transfer[1], body, digest)
                except SinkFailure as exc:
                    self._fail(state, transfer[1], str(exc), transfer[3])
                    return
                size = len(body)
                state.ok += 1
                state.bytes += size
                self.files_ok += 1
                self.bytes += size
                state.remaining -= 1
                if state.remaining == 0:
                    self._page_finished(state)
                return
            self._retry_or_fail(transfer, reason, True, None)
            return
        else:
            status = handle.getinfo(pycurl.RESPONSE_CODE)
            retryable = retryable_status(status)
            reason = f"HTTP {status}"
            if status in (429, 503):
                retry_after = retry_after_seconds(header_value(lines, b"retry-after"))
        chunks.clear()
        lines.clear()
        self.free.append(handle)
        self._retry_or_fail(transfer, reason, retryable, retry_after)

    def _retry_or_fail(self, transfer: _Transfer, reason: str, retryable: bool,
                       retry_after: float | None) -> None:
        state, name, url, attempt = transfer
        if retryable and attempt <= self.policy.retries:
            delay = self.policy.delay(attempt, retry_after, self.rng)
            self.retries += 1
            heapq.heappush(self.waiting, (time.monotonic() + delay, next(self.order),
                                          (state, name, url, attempt + 1)))
        else:
            self._fail(state, name, reason, attempt)

    def _fail(self, state: _PageState, name: str, reason: str, attempts: int) -> None:
        state.failures.append(Failure(name, reason, attempts))
        self.files_failed += 1
        state.remaining -= 1
        if state.remaining == 0:
            self._page_finished(state)

    def _page_finished(self, state: _PageState) -> None:
        self.pages_held -= 1
        self.fetched += 1
        self.finished += self.sink.end_page(
            PageReport(state.page.seq, state.ok, state.bytes, tuple(state.failures)))

    def take_fetched(self) -> int:
        """Pages finished fetching since the last call (durable or not yet)."""
        fetched, self.fetched = self.fetched, 0
        return fetched

    # -- reporting and stopping ----------------------------------------------------------
    def tick(self) -> Tick:
        return Tick(self.worker, self.files_ok, self.files_failed, self.bytes, self.retries,
                    self.in_flight)

    def abandon(self) -> None:
        """Drop everything in flight; unfinished pages stay not-done in the journal."""
        for handle in self.handles:
            if handle.transfer is not None:
                self.multi.remove_handle(handle)
                handle.transfer = None
                handle.chunks.clear()
                handle.lines.clear()
                self.free.append(handle)
        self.in_flight = 0
        self.pending.clear()
        self.waiting.clear()

    def close(self) -> None:
        self.abandon()
        for handle in self.handles:
            handle.close()
        self.multi.close()
