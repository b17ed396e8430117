"""One worker's transfers: a libcurl multi loop with reused handles, retries on a timer heap,
verification, and the sink. Pages go in; PageReports come out when every name of a page is
either stored or failed."""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import pycurl

from bulkfetch.config import GetOptions
from bulkfetch.engine.adaptive import Controller, open_file_ceiling
from bulkfetch.engine.big import BigFiles
from bulkfetch.engine.coordinator_side import LATENCY_SLOTS, CoordinatorSide
from bulkfetch.engine.digests import (
    BY_DIGEST,
    BY_MD5,
    BY_SIZE,
    LISTING,
    Pinned,
    held_body_mismatch,
    states_digest,
)
from bulkfetch.engine.host_windows import HostWindows
from bulkfetch.engine.hosts import HostGate, host_of
from bulkfetch.engine.request_headers import RequestHeaders
from bulkfetch.engine.retrying import Retrying
from bulkfetch.engine.sized import sized_streams
from bulkfetch.engine.stated import SHA256, stated_md5, unlike_listing
from bulkfetch.models import Failure, Page, PageReport
from bulkfetch.net.curl import (
    RETRYABLE_CURL_ERRORS,
    TLS_FATAL_ERRORS,
    error_code,
    header_value,
    new_handle,
    retry_after_seconds,
    retryable_status,
)
from bulkfetch.net.redirects import REDIRECT_STATUSES
from bulkfetch.sinks.base import Sink, SinkFailure, Writer
from bulkfetch.sources.base import Source, data_url_body, unusable_name
from bulkfetch.util.md5 import SMALL_BODY, builtin_md5, openssl_md5
from bulkfetch.util.names import check_name

_URL = pycurl.URL
_HTTPHEADER = pycurl.HTTPHEADER
_TOTAL_TIME = pycurl.TOTAL_TIME
# Failures that say the server (or the path to it) has more than it can take
CONGESTION_CURL_ERRORS = frozenset({pycurl.E_OPERATION_TIMEDOUT, pycurl.E_COULDNT_CONNECT})
# libcurl stopped a transfer at MAXFILESIZE: the body is bigger than --spool-above.
_TOO_BIG = pycurl.E_FILESIZE_EXCEEDED


@dataclass(slots=True, eq=False)  # compared and hashed by identity
class _PageState:
    page: Page
    remaining: int
    write: Writer
    bytes: int = 0
    failures: list[Failure] = field(default_factory=list)
    # What the listing stated of the page's items (S3: Size and ETag), by item: (size, hex
    # MD5 or ""); None when it stated nothing. A body unlike it is another version.
    listed: dict[str, tuple[int, str]] | None = None
    # A cache's page (Page.headers): each item's extra request header lines (none: not in
    # it); None for every other page.
    headers: dict[str, list[str]] | None = None

    @property
    def ok(self) -> int:
        """Files stored so far, derived from what is left: the per-file path updates one
        counter less."""
        return len(self.page.names) - self.remaining - len(self.failures)


# A transfer is a plain tuple (page state, name, url, attempt): building one per file must
# cost less than a Python-level __init__ call.
_Transfer = tuple[_PageState, str, str, int]


# multi.select() is select(2) over curl_multi_fdset(), which leaves out every socket numbered
# 1024 or more (FD_SETSIZE). With more handles than this, some transfers' sockets cannot
# wake the loop, so it looks again at least every HIGH_FD_WAIT_S. (libcurl's socket-action
# interface over epoll is the full answer, but driven from Python it cost about 20 us more
# a file than this loop: benchmarks/results/2026-11-24-session16-issue21.txt.)
SELECT_SEES = 900
HIGH_FD_WAIT_S = 0.005


_MD5_MISMATCH = "MD5 of the body does not match the server's ETag/Content-MD5"


class Fetcher(RequestHeaders, CoordinatorSide, Retrying):
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
        self.spool_above = options.limits.spool_above
        self.free: list[pycurl.Curl] = []
        # Per-handle state lives in dicts keyed by the handle: an attribute on a pycurl
        # object costs a failed generic lookup (an AttributeError built and dropped) first.
        self.buffers: dict[pycurl.Curl, tuple[list[bytes], list[bytes]]] = {}
        self.transfer_of: dict[pycurl.Curl, _Transfer] = {}
        # What every request of this source needs (an S3 source: SigV4 signing and its
        # headers), set once per handle; a piece of a big file adds its Range to the headers.
        source_options = getattr(source, "curl_options", list)()
        self.base_headers: list[str] = next(
            (value for option, value in source_options if option == pycurl.HTTPHEADER), [])
        # A source whose every request is signed anew (S3 with credentials): url -> the
        # request's headers, set per transfer.
        self.sign: Callable[[str], list[str]] | None = getattr(
            source, "request_signer", lambda: None)()
        # The headers set on each transfer as it starts, when some are per transfer: signed
        # ones, or a cache's page's (_page_headers); None: the handle's own stay.
        sign = self.sign
        self.request_headers: Callable[[_Transfer], list[str]] | None = \
            (lambda transfer: sign(transfer[2])) if sign is not None else None
        # What handles a finished transfer: _completed, or _completed_cached once a page
        # of a cache came (step() looks it up once a turn, not once a file).
        self.on_completed: Callable[[pycurl.Curl, tuple[int, str] | None], None] = \
            self._completed
        self.not_modified = 0  # 304s to conditional requests (each counts as stored)
        # A source that vouches for its files' sizes and digests itself (a registry's blobs,
        # from their manifests): name -> digests.Pinned, checked in place of the server's.
        self.pinned: Callable[[str], Pinned | None] | None = getattr(source, "pinned", None)
        # A source whose credentials expire (a registry's bearer token): url -> whether a
        # 401 there is worth another attempt with renewed credentials.
        self.reauthorize: Callable[[str], bool] | None = getattr(source, "reauthorize", None)
        # A source that can ask for the layout of an object uploaded in parts (S3): url ->
        # the URL and headers of that request (engine/multipart.py).
        self.layout_request: Callable[[str], tuple[str, list[str]]] | None = getattr(
            source, "layout_request", None)
        # Per-host pauses (Retry-After) and --max-rps (a worker's share of it); made on
        # the first Retry-After when no --max-rps asks for it from the start.
        limits = options.limits
        self.gate: HostGate | None = HostGate(
            limits.max_rps / limits.workers, limits.limit_rate / limits.workers) \
            if limits.max_rps or limits.limit_rate else None
        self.source_options = source_options
        # --limit-rate: the worker's share, the most one body may take (libcurl's cap)
        self.handle_rate = max(1, limits.limit_rate // limits.workers) \
            if limits.limit_rate else 0
        self.held_ticks = 0  # ticks at which the gate held transfers (Tick.held_ticks)
        # A source whose requests carry the user's headers turns libcurl's redirects off
        # (they would carry any custom header to another host): the fetcher follows them,
        # each hop with the headers for its own URL (net/redirects.py). By page, the
        # items redirected: name -> (the listed URL, hops so far); a retry starts over.
        # Only a source that says so: a signed S3 source turns redirects off too, and wants
        # a 3xx to stay a failure (the bucket is elsewhere), not followed with its signature.
        self.follows = bool(getattr(source, "follows_redirects", False))
        self.hops: dict[_PageState, dict[str, tuple[str, int]]] = {}
        # --concurrency auto: the controller moves the number of handles (engine/adaptive.py)
        self.controller: Controller | None = None
        if limits.adaptive:
            self.controller = Controller(limits.concurrency,
                                         min(limits.max_concurrency, open_file_ceiling()))
        # (a fixed --concurrency too: sockets beyond the descriptors would leave none for
        # the files, and every file would fail; the CLI says so, cli/get.py)
        self.window = self.controller.limit if self.controller else \
            min(limits.concurrency, open_file_ceiling())
        # ... and once a second host appears, each host's own (host_windows.py): until
        # then `first_host` is the only one seen and the worker's controller is its own.
        self.windows: HostWindows | None = None
        self.first_host: str | None = None
        # --metrics: requests by latency bucket (the last one +Inf) and their summed seconds
        self.latency: list[int] | None = \
            [0] * LATENCY_SLOTS if options.metrics else None
        self.latency_sum = 0.0
        self.hosts: tuple[tuple[str, int], ...] = ()  # in flight by host, counted per second
        self.host_limits: tuple[tuple[str, int], ...] = ()  # ... and their limits (auto)
        self.hosts_counted = 0.0
        self.peak_window = self.window
        for _ in range(self.window):
            self.free.append(self._new_handle())
        self.handles = list(self.free)
        self.pending: deque[_Transfer] = deque()
        # Bodies above --spool-above; `spooling` is its handles in flight, by handle.
        self.big = BigFiles(self)
        self.spooling = self.big.active
        # Retry heap by due time: (due, order, transfer, a big body's).
        self.waiting: list[tuple[float, int, tuple[object, ...], bool]] = []
        self.order = itertools.count()
        self.finished: list[PageReport] = []  # durable page reports, not yet taken
        self.fetched = 0  # pages whose every file is stored or failed, not yet taken
        self.pages_held = 0
        # Totals of finished pages; the pages in hand add theirs at tick time (not per file).
        self.files_ok = self.files_failed = self.bytes = self.retries = 0
        self.checked = [0, 0, 0]  # stored bodies by how they were checked: BY_MD5 ...
        self.live: set[_PageState] = set()

    def _new_handle(self) -> pycurl.Curl:
        handle = new_handle(self.options.timeouts, self.options.tls)
        chunks: list[bytes] = []
        lines: list[bytes] = []
        handle.setopt(pycurl.WRITEFUNCTION, chunks.append)
        handle.setopt(pycurl.HEADERFUNCTION, lines.append)
        handle.setopt(pycurl.MAXFILESIZE_LARGE, self.spool_above)
        if self.handle_rate:  # one body alone never goes faster than the worker's share
            handle.setopt(pycurl.MAX_RECV_SPEED_LARGE, self.handle_rate)
        for option, value in self.source_options:
            handle.setopt(option, value)
        self.buffers[handle] = (chunks, lines)
        return handle

    def _resize(self, limit: int) -> None:
        """Keep `limit` handles: new ones join the idle pool; idle ones beyond the limit are
        closed now, busy ones at a later resize (in flight never exceeds the pool)."""
        self.window = limit
        self.peak_window = max(self.peak_window, limit)
        handles = self.handles
        if limit > len(handles):
            grown = [self._new_handle() for _ in range(limit - len(handles))]
            self.free.extend(grown)
            handles.extend(grown)
        elif limit < len(handles) and self.free:
            surplus = min(len(handles) - limit, len(self.free))
            dropped = self.free[-surplus:]
            del self.free[-surplus:]
            gone = set(dropped)
            self.handles = [handle for handle in handles if handle not in gone]
            for handle in dropped:
                del self.buffers[handle]
                handle.close()

    # -- feeding -------------------------------------------------------------------------
    @property
    def wants_pages(self) -> bool:
        parked = self.gate.count if self.gate is not None else 0
        return len(self.pending) + len(self.big.sized) + parked < self.window

    @property
    def idle(self) -> bool:
        return self.pages_held == 0

    def add_page(self, page: Page) -> None:
        urls = self.source.plain_urls(page.names)
        if urls is not None:  # every name is plain: no per-name check, tuples built in C
            self._add_plain(page, urls)
            return
        # Resolved first: the sink is told the page's names (in listing order) as it begins.
        names: list[str] = []
        ready: list[tuple[str, str]] = []  # (name, url) to fetch
        # (name, reason, url): the URL it would have been fetched from, "" when unknown
        refused: list[tuple[str, str, str]] = []
        inline: list[tuple[str, str, bytes]] = []  # data: URLs (a row's --save-cols JSON)
        resolve = self.source.resolve
        for item in page.names:
            url = ""
            try:
                name, url = resolve(item)
            except UnicodeError:  # e.g. a lone surrogate from \udcff in the JSON
                name, reason = item, "unsafe name: name is not valid UTF-8"
            except ValueError as exc:
                name, reason = unusable_name(item), str(exc)
            else:
                reason = check_name(name)
                if reason is None:
                    names.append(name)
                    if url.startswith("data:"):
                        try:
                            inline.append((name, url, data_url_body(url)))
                        except ValueError as exc:
                            refused.append((name, str(exc), url))
                    else:
                        ready.append((name, url))
                    continue
                reason = f"unsafe name: {reason}"
            names.append(name)
            refused.append((name, reason, url))
        state = self._begin(page, names)
        for name, reason, url in refused:
            self._fail(state, name, reason, 0, url)
        for name, url, body in inline:
            self._store_inline(state, name, url, body)
        queue = self.pending if self.spool_above else self.big.pending
        partials, resume = self.big.partials, self.big.resume
        if self.controller is not None and self.windows is None:
            self._look_for_hosts(ready)
        sized = sized_streams(self, state, page)
        for name, url in ready:
            transfer = (state, name, url, 1)
            if partials and name in partials and resume(transfer):
                continue
            if sized is not None and sized(transfer):
                self.big.sized.append(transfer)
            else:
                queue.append(transfer)
        if state.remaining == 0 and state in self.live:
            self._page_finished(state)

    def _look_for_hosts(self, ready: list[tuple[str, str]]) -> None:
        """--concurrency auto: on the second host, a controller per host (host_windows.py).
        The first keeps what the worker's controller learned of it."""
        if not ready:
            return
        if self.first_host is None:
            self.first_host = host_of(ready[0][1])
        first = self.first_host
        prefix = first + "/"  # one C call a URL in the usual case, not host_of()'s slicing
        if all(url.startswith(prefix) or host_of(url) == first for _, url in ready):
            return
        controller = self.controller
        assert controller is not None
        windows = HostWindows(self.options.limits.concurrency, controller.ceiling)
        windows.adopt(self.first_host, controller.limit)
        controller.watch_latency = False  # each host's watches its own (adaptive.py)
        if self.gate is None:
            self.gate = HostGate()
        self.gate.windows = self.windows = windows

    def _begin(self, page: Page, names: Sequence[str]) -> _PageState:
        state = _PageState(page, len(page.names), self.sink.begin_page(page.seq, names))
        if page.headers is not None:
            self._cache_page(state, names, page.headers)
        sizes, md5s = page.sizes, page.md5s
        if sizes is not None and len(sizes) == len(page.names) and (
                md5s is None or len(md5s) == len(sizes)):
            # by name, as _completed() looks it up (an item may be "name NUL url")
            state.listed = dict(zip(names, zip(sizes, md5s or ("",) * len(sizes),
                                               strict=True), strict=True))
        self.pages_held += 1
        self.live.add(state)
        return state

    def _add_plain(self, page: Page, urls: Iterable[str]) -> None:
        state = self._begin(page, page.names)
        # --spool-above 0: every body streams (libcurl reads MAXFILESIZE 0 as no limit).
        queue = self.pending if self.spool_above else self.big.pending
        sized = sized_streams(self, state, page)
        if not self.big.partials and sized is None:
            queue.extend(zip(repeat(state), page.names, urls, repeat(1)))
        else:  # partial files a killed run left, or bodies the listing sized as big
            partials, resume = self.big.partials, self.big.resume
            for name, url in zip(page.names, urls, strict=True):
                transfer = (state, name, url, 1)
                if partials and name in partials and resume(transfer):
                    continue
                if sized is not None and sized(transfer):
                    self.big.sized.append(transfer)
                else:
                    queue.append(transfer)
        if not page.names:
            self._page_finished(state)

    def _store_inline(self, state: _PageState, name: str, url: str, body: bytes) -> None:
        """A body the listing carried (a data: URL): stored as fetched, checked by nobody."""
        try:
            state.write(name, body, None)
        except SinkFailure as exc:
            self._fail(state, name, str(exc), 0, url)
            return
        self._stored(state, len(body))

    # -- the loop ------------------------------------------------------------------------
    def step(self, timeout: float) -> list[PageReport]:
        """Start what can start, move transfers on, and return the page reports that became
        durable since (see take_fetched() for pages that finished fetching)."""
        if self.waiting:
            now = time.monotonic()
            while self.waiting and self.waiting[0][0] <= now:
                _, _, transfer, big = heapq.heappop(self.waiting)
                (self.big.pending if big else self.pending).append(transfer)
        multi, free, pending, transfer_of = self.multi, self.free, self.pending, self.transfer_of
        gate = self.gate
        if gate is not None and gate.count:
            for transfer, big in reversed(gate.release()):  # ahead of the later ones
                (self.big.pending if big else pending).appendleft(transfer)
        if self.big.pending or self.big.sized:
            self.big.start_some()
        request_headers = self.request_headers
        while free and pending:
            transfer = pending.popleft()
            if gate is not None and not gate.admit(transfer):
                continue  # its host is paused or at its rate: parked in the gate
            handle = free.pop()
            transfer_of[handle] = transfer
            handle.setopt(_URL, transfer[2])
            if request_headers is not None:
                handle.setopt(_HTTPHEADER, request_headers(transfer))
            multi.add_handle(handle)
        controller, latency = self.controller, self.latency
        if controller is not None:
            controller.in_flight(len(self.handles) - len(free))
        if len(free) < len(self.handles):
            while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            completed = self.on_completed
            while True:
                queued, succeeded, failed = multi.info_read()
                if controller is None and latency is None:
                    for handle in succeeded:
                        completed(handle, None)
                else:  # each one's time from start to end: the controller's latency
                    took = 0.0
                    windows = self.windows
                    for handle in succeeded:
                        seconds = handle.getinfo(_TOTAL_TIME)
                        took += seconds
                        if latency is not None:
                            self._timed(seconds)
                        if windows is not None:
                            windows.completed(host_of(transfer_of[handle][2]), seconds)
                        completed(handle, None)
                    if controller is not None:
                        controller.completed(len(succeeded), took)
                for handle, code, message in failed:
                    if code in TLS_FATAL_ERRORS:  # only failures pay for this test
                        raise self._tls_fatal(handle, code, message)
                    if latency is not None:
                        self._timed(handle.getinfo(_TOTAL_TIME))
                    completed(handle, (code, message))
                if not queued:
                    break
            if len(free) < len(self.handles) and not (self.finished or self.fetched):
                if self.spooling and len(self.spooling) + len(free) == len(self.handles):
                    self.big.nap()
                if gate is not None and gate.count:  # a parked host's turn may come first
                    wake = gate.next_wake()
                    if wake is not None:
                        timeout = min(timeout, wake)
                if len(self.handles) <= SELECT_SEES:
                    multi.select(timeout)
                else:  # see SELECT_SEES
                    timeout = min(timeout, HIGH_FD_WAIT_S)
                    began = time.monotonic()
                    # with no socket below 1024, pycurl's select() returns 0 at once
                    if multi.select(timeout) == 0 and time.monotonic() - began < timeout / 2:
                        time.sleep(timeout)
        elif self.big.ranged and self.big.wait_hashing(timeout):
            pass  # nothing in flight: waited for a split file's last bytes to hash
        # Transfers wait for their retry (a split file's pieces too: then no hash job runs,
        # and without the sleep the loop would spin until the retry is due).
        elif (self.waiting or (gate is not None and gate.count)) \
                and not (self.finished or self.fetched):
            time.sleep(min(timeout, self._next_due()))
        if self.big.ranged:
            self.big.poll()
        if self.spooling and self.big.pacing is not None:
            self.big.pacing.turn(self.spooling)
        if controller is not None:
            now = time.monotonic()
            if controller.due(now):
                self._resize(controller.decide(now))
            if self.windows is not None:
                rose = self.windows.sweep()
                if rose:
                    self.gate.wake_hosts(rose)  # type: ignore[union-attr]
        finished, self.finished = self.finished, []
        return finished

    def _next_due(self) -> float:
        """Seconds until a retry is due or a parked host may be asked again."""
        due = max(0.0, self.waiting[0][0] - time.monotonic()) if self.waiting else None
        wake = self.gate.next_wake() if self.gate is not None else None
        return min((seconds for seconds in (due, wake) if seconds is not None), default=0.0)

    def _completed(self, handle: pycurl.Curl, error: tuple[int, str] | None) -> None:
        """One transfer ended. The success path is written flat: it runs once per file."""
        if self.spooling and handle in self.spooling:
            self.big.completed(handle, error)
            return
        self.multi.remove_handle(handle)
        transfer = self.transfer_of[handle]
        if self.windows is not None:
            self.gate.done(transfer[2])  # type: ignore[union-attr]
        chunks, lines = self.buffers[handle]
        retry_after = None
        if error is not None:
            code, message = error
            if code == _TOO_BIG:  # not a failure: the body goes to a spool instead
                if self.gate is not None:  # (no byte of its body came: --limit-rate)
                    self.gate.ended(transfer[2], sent=False)
                self.big.too_big(transfer, lines)
                chunks.clear()
                lines.clear()
                self.free.append(handle)
                return
            retryable, reason = code in RETRYABLE_CURL_ERRORS, f"{message} (curl error {code})"
            if self.controller is not None and code in CONGESTION_CURL_ERRORS:
                self._congested(transfer[2])
        elif handle.getinfo(pycurl.RESPONSE_CODE) == 200:
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            digest = None
            if self.verify:
                digest = (builtin_md5 if len(body) < SMALL_BODY else openssl_md5)(
                    body).hexdigest()  # md5_hex() inlined: this runs once per file
                # The common case costs one list search for the exact header line: a strong
                # ETag that is the body's MD5, which also proves the body whole (no
                # Content-Length check needed). Any other spelling takes the full parse.
                way = BY_MD5
                if b'ETag: "' + digest.encode() + b'"\r\n' in lines:  # + beats %: 150 ns
                    reason = None
                else:
                    lowered = b"".join(lines).lower()
                    expected = stated_md5(lines, lowered)
                    reason = self._short(handle, body) or (
                        _MD5_MISMATCH if expected is not None and expected != digest else None)
                    if expected is None:  # no MD5 stated (a multipart S3 ETag, nginx's)
                        way = BY_SIZE
                        if reason is None and states_digest(lowered):
                            reason, way = held_body_mismatch(lines, body, digest)
            else:
                way = BY_SIZE
                reason = self._short(handle, body)
            chunks.clear()
            lines.clear()
            self.free.append(handle)
            if self.pinned is not None and reason is None:
                pinned = self.pinned(transfer[1])
                if pinned is not None:
                    reason, way = pinned.mismatch(body), BY_DIGEST
            if transfer[0].listed is not None and reason is None:
                listed = transfer[0].listed.get(transfer[1])
                if listed is not None:
                    changed = unlike_listing(listed, body, digest)
                    if changed is not None:  # a whole answer, for another version: final
                        self._fail(transfer[0], transfer[1], changed, transfer[3],
                                   transfer[2])
                        return
                    if listed[1] and digest is not None:
                        way = BY_DIGEST if listed[1].startswith(SHA256) else BY_MD5
            if reason is None:
                state = transfer[0]
                try:
                    state.write(transfer[1], body, digest)
                except SinkFailure as exc:
                    self._fail(state, transfer[1], str(exc), transfer[3], transfer[2])
                    return
                self.checked[way] += 1
                state.bytes += len(body)
                if self.gate is not None:
                    self.gate.received(transfer[2], len(body))
                state.remaining -= 1
                if state.remaining == 0:
                    self._page_finished(state)
                return
            self._retry_or_fail(transfer, reason, True, None)
            return
        else:
            status = handle.getinfo(pycurl.RESPONSE_CODE)
            if self.follows and status in REDIRECT_STATUSES:
                self._redirected(handle, transfer, header_value(lines, b"location"))
                return
            retryable = retryable_status(status) or (
                status == 401 and self.reauthorize is not None and self.reauthorize(transfer[2]))
            reason = f"HTTP {status}" + error_code(chunks)
            if status in (429, 503):
                retry_after = retry_after_seconds(header_value(lines, b"retry-after"))
                if self.controller is not None:  # a pause asked for pauses the host: less
                    self._congested(transfer[2], bool(retry_after))
        chunks.clear()
        lines.clear()
        self.free.append(handle)
        self._retry_or_fail(transfer, reason, retryable, retry_after)

    def pin_of(self, transfer: tuple[Any, ...]) -> Pinned | None:
        """What the source vouches for of the file `transfer` fetches: its own pin (a
        registry blob's descriptor), else its page's listed size and MD5, else None."""
        state, name = transfer[0], transfer[1]
        if self.pinned is not None:
            pinned = self.pinned(name)
            if pinned is not None:
                return pinned
        listed = state.listed.get(name) if state.listed is not None else None
        if listed is None or listed[0] < 0:
            return None
        size, md5 = listed
        if md5 and self.verify:
            if md5.startswith(SHA256):
                return Pinned(size, "sha256", bytes.fromhex(md5[len(SHA256):]), LISTING)
            return Pinned(size, "md5", bytes.fromhex(md5), LISTING)
        return Pinned(size, "", b"", LISTING)

    @staticmethod
    def _short(handle: pycurl.Curl, body: bytes) -> str | None:
        announced = handle.getinfo(pycurl.CONTENT_LENGTH_DOWNLOAD_T)
        if announced >= 0 and announced != len(body):
            return f"body of {len(body)} bytes, Content-Length {int(announced)}"
        return None

    def _stored(self, state: _PageState, size: int) -> None:
        """A file of `size` bytes of the page `state` is in the sink."""
        state.bytes += size
        state.remaining -= 1
        if state.remaining == 0:
            self._page_finished(state)

    def _page_finished(self, state: _PageState) -> None:
        self.live.discard(state)
        if self.hops:
            self.hops.pop(state, None)
        ok = state.ok
        self.files_ok += ok
        self.bytes += state.bytes
        self.pages_held -= 1
        self.fetched += 1
        self.finished += self.sink.end_page(
            PageReport(state.page.seq, ok, state.bytes, tuple(state.failures)))

    def take_finished(self) -> list[PageReport]:
        """Durable page reports that step() has not returned (a SinkFatal cut it short)."""
        finished, self.finished = self.finished, []
        return finished

    def take_fetched(self) -> int:
        """Pages finished fetching since the last call (durable or not yet)."""
        fetched, self.fetched = self.fetched, 0
        return fetched

    # -- stopping ----------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self.handles) - len(self.free)

    def abandon(self) -> None:
        """Drop everything in flight; unfinished pages stay not-done in the journal."""
        self.big.abandon()  # its handles first: they go back to a small file's options
        idle = set(self.free)
        for handle in self.handles:
            if handle not in idle:
                self.multi.remove_handle(handle)
                for buffer in self.buffers[handle]:
                    buffer.clear()
                self.free.append(handle)
        self.pending.clear()
        self.waiting.clear()
        if self.gate is not None:
            self.gate.clear()

    def close(self) -> None:
        self.abandon()
        self.big.close()
        for handle in self.handles:
            handle.close()
        self.multi.close()
