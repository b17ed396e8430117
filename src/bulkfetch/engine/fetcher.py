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
    new_handle,
    retry_after_seconds,
    retryable_status,
    validators,
)
from bulkfetch.models import Failure, Page, PageReport, Tick
from bulkfetch.names import check_name
from bulkfetch.sinks.base import Sink, SinkFailure
from bulkfetch.sources.base import Source

_HEX = frozenset("0123456789abcdef")


@dataclass(slots=True)
class _PageState:
    page: Page
    remaining: int
    ok: int = 0
    bytes: int = 0
    failures: list[Failure] = field(default_factory=list)


@dataclass(slots=True)
class _Transfer:
    state: _PageState
    name: str
    url: str
    attempt: int = 1


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
        self.active: set[pycurl.Curl] = set()
        self.pending: deque[_Transfer] = deque()
        self.waiting: list[tuple[float, int, _Transfer]] = []  # retry heap
        self.order = itertools.count()
        self.finished: list[PageReport] = []
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
        state = _PageState(page, len(page.names))
        self.pages_held += 1
        for item in page.names:
            try:
                name, url = self.source.resolve(item)
            except ValueError as exc:
                self._fail(state, item, str(exc), 0)
                continue
            reason = check_name(name)
            if reason is not None:
                self._fail(state, name, f"unsafe name: {reason}", 0)
                continue
            self.pending.append(_Transfer(state, name, url))
        if state.remaining == 0:
            self._page_finished(state)

    # -- the loop ------------------------------------------------------------------------
    def step(self, timeout: float) -> list[PageReport]:
        """Start what can start, move transfers on, and return the pages finished since."""
        if self.waiting:
            now = time.monotonic()
            while self.waiting and self.waiting[0][0] <= now:
                self.pending.append(heapq.heappop(self.waiting)[2])
        multi = self.multi
        while self.free and self.pending:
            transfer = self.pending.popleft()
            handle = self.free.pop()
            handle.transfer = transfer
            handle.setopt(pycurl.URL, transfer.url)
            multi.add_handle(handle)
            self.active.add(handle)
        if self.active:
            while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            while True:
                queued, succeeded, failed = multi.info_read()
                for handle in succeeded:
                    self._completed(handle, None)
                for handle, code, message in failed:
                    self._completed(handle, (code, message))
                if not queued:
                    break
            if self.active and not self.finished:
                multi.select(timeout)
        elif self.waiting and not self.finished:
            time.sleep(min(timeout, max(0.0, self.waiting[0][0] - time.monotonic())))
        finished, self.finished = self.finished, []
        return finished

    def _completed(self, handle: pycurl.Curl, error: tuple[int, str] | None) -> None:
        self.multi.remove_handle(handle)
        self.active.remove(handle)
        transfer: _Transfer = handle.transfer
        handle.transfer = None
        chunks, lines = handle.chunks, handle.lines
        retry_after = None
        if error is not None:
            code, message = error
            retryable, reason = code in RETRYABLE_CURL_ERRORS, f"{message} (curl error {code})"
        else:
            status = handle.getinfo(pycurl.RESPONSE_CODE)
            if status == 200:
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                reason = self._verify(handle, body, lines)
                if reason is None:
                    chunks.clear()
                    lines.clear()
                    self.free.append(handle)
                    self._store(transfer, body)
                    return
                retryable = True
            else:
                retryable = retryable_status(status)
                reason = f"HTTP {status}"
                if status in (429, 503):
                    retry_after = retry_after_seconds(header_value(lines, b"retry-after:"))
        chunks.clear()
        lines.clear()
        self.free.append(handle)
        if retryable and transfer.attempt <= self.policy.retries:
            delay = self.policy.delay(transfer.attempt, retry_after, self.rng)
            transfer.attempt += 1
            self.retries += 1
            heapq.heappush(self.waiting, (time.monotonic() + delay, next(self.order), transfer))
        else:
            self._fail(transfer.state, transfer.name, reason, transfer.attempt)

    def _verify(self, handle: pycurl.Curl, body: bytes, lines: list[bytes]) -> str | None:
        announced = handle.getinfo(pycurl.CONTENT_LENGTH_DOWNLOAD)
        if announced >= 0 and announced != len(body):
            return f"body of {len(body)} bytes, Content-Length {int(announced)}"
        if self.verify:
            etag, content_md5 = validators(lines)
            if etag is None and content_md5 is None:
                return None
            digest = hashlib.md5(body).hexdigest()
            if content_md5 is None and etag == f'"{digest}"':
                return None  # the common case: a strong ETag that is the body's MD5
            expected = expected_md5(etag, content_md5)
            if expected is not None and digest != expected:
                return "MD5 of the body does not match the server's ETag/Content-MD5"
        return None

    def _store(self, transfer: _Transfer, body: bytes) -> None:
        state = transfer.state
        try:
            self.sink.write(transfer.name, body)
        except SinkFailure as exc:
            self._fail(state, transfer.name, str(exc), transfer.attempt)
            return
        state.ok += 1
        state.bytes += len(body)
        self.files_ok += 1
        self.bytes += len(body)
        state.remaining -= 1
        if state.remaining == 0:
            self._page_finished(state)

    def _fail(self, state: _PageState, name: str, reason: str, attempts: int) -> None:
        state.failures.append(Failure(name, reason, attempts))
        self.files_failed += 1
        state.remaining -= 1
        if state.remaining == 0:
            self._page_finished(state)

    def _page_finished(self, state: _PageState) -> None:
        self.sink.commit_page()
        self.pages_held -= 1
        self.finished.append(
            PageReport(state.page.seq, state.ok, state.bytes, tuple(state.failures))
        )

    # -- reporting and stopping ----------------------------------------------------------
    def tick(self) -> Tick:
        return Tick(self.worker, self.files_ok, self.files_failed, self.bytes, self.retries,
                    len(self.active))

    def abandon(self) -> None:
        """Drop everything in flight; unfinished pages stay not-done in the journal."""
        for handle in self.active:
            self.multi.remove_handle(handle)
        self.active.clear()
        self.pending.clear()
        self.waiting.clear()

    def close(self) -> None:
        self.abandon()
        for handle in self.free:
            handle.close()
        self.multi.close()
