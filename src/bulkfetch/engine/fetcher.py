"""One worker's transfers: a libcurl multi loop with reused handles, retries on a timer heap,
verification, and the sink. Pages go in; PageReports come out when every name of a page is
either stored or failed.

This is the small-body path, which runs once per file; what it shares with the big bodies
(big.py) is the worker's Transfers (transfers.py) and its ledger of pages (pages.py).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat

import pycurl

from bulkfetch.config import GetOptions
from bulkfetch.dest.validators import http_validators
from bulkfetch.engine.adaptive import open_file_ceiling
from bulkfetch.engine.auto import AutoConcurrency
from bulkfetch.engine.big import BigFiles
from bulkfetch.engine.conditional import ConditionalPages
from bulkfetch.engine.digests import BY_DIGEST, BY_MD5, BY_SIZE, held_body_mismatch, states_digest
from bulkfetch.engine.hosts import host_of
from bulkfetch.engine.pages import Pages, PageState, Transfer, resolve_items
from bulkfetch.engine.request_stats import RequestStats
from bulkfetch.engine.second_tries import SecondTries
from bulkfetch.engine.stated import SHA256, stated_md5, unlike_listing
from bulkfetch.engine.transfers import Transfers
from bulkfetch.models import Page, PageReport, Tick, largest_first
from bulkfetch.net.curl import (
    RETRYABLE_CURL_ERRORS,
    TLS_FATAL_ERRORS,
    FatalTransferError,
    error_code,
    header_value,
    retry_after_seconds,
    retryable_status,
    tls_failure,
)
from bulkfetch.net.redirects import REDIRECT_STATUSES
from bulkfetch.sinks.base import KeepsValidators, Sink, SinkFailure
from bulkfetch.sources.base import Source
from bulkfetch.util.md5 import SMALL_BODY, builtin_md5, openssl_md5

_URL = pycurl.URL
_HTTPHEADER = pycurl.HTTPHEADER
_TOTAL_TIME = pycurl.TOTAL_TIME
# Failures that say the server (or the path to it) has more than it can take
CONGESTION_CURL_ERRORS = frozenset({pycurl.E_OPERATION_TIMEDOUT, pycurl.E_COULDNT_CONNECT})
# libcurl stopped a transfer at MAXFILESIZE: the body is bigger than --spool-above.
_TOO_BIG = pycurl.E_FILESIZE_EXCEEDED


# multi.select() is select(2) over curl_multi_fdset(), which leaves out every socket numbered
# 1024 or more (FD_SETSIZE). With more handles than this, some transfers' sockets cannot
# wake the loop, so it looks again at least every HIGH_FD_WAIT_S. (libcurl's socket-action
# interface over epoll is the full answer, but driven from Python it cost about 20 us more
# a file than this loop: benchmarks/results/2026-11-24-session16-issue21.txt.)
SELECT_SEES = 900
HIGH_FD_WAIT_S = 0.005


_MD5_MISMATCH = "MD5 of the body does not match the server's ETag/Content-MD5"


class Fetcher:
    def __init__(self, options: GetOptions, source: Source, sink: Sink, worker: int = 0,
                 rng: random.Random | None = None) -> None:
        self.options = options
        self.source = source
        self.sink = sink
        self.worker = worker
        self.pages = Pages(sink)
        transfers = self.transfers = Transfers(options, source.abilities(), self.pages, rng)
        # The shared containers, kept here too: the per-file path reads them every file.
        self.multi, self.free, self.handles = transfers.multi, transfers.free, transfers.handles
        self.buffers, self.transfer_of = transfers.buffers, transfers.transfer_of
        self.checked = transfers.checked
        self.verify = options.verify
        # where the sink keeps them, a body's validators when its ETag is not its MD5
        self.keep_validators = sink.keep_validators if isinstance(sink, KeepsValidators) \
            else None
        self.pinned = transfers.pinned
        self.spool_above = options.limits.spool_above
        # What handles a finished transfer: _completed, or the conditional pages' once one
        # came (step() looks it up once a turn, not once a file).
        self.on_completed = self._completed
        self.conditional: ConditionalPages | None = None
        limits = options.limits
        # --concurrency auto: a controller moves the number of handles (auto.py)
        self.auto = AutoConcurrency(limits, transfers) if limits.adaptive else None
        self.controller = self.auto.controller if self.auto is not None else None
        # (a fixed --concurrency too: sockets beyond the descriptors would leave none for
        # the files, and every file would fail; the CLI says so, cli/get.py)
        self.window = self.controller.limit if self.controller else \
            min(limits.concurrency, open_file_ceiling())
        self.peak_window = self.window
        # --metrics: request latencies and transfers by host, for the ticks
        self.stats = RequestStats() if options.metrics else None
        self.held_ticks = 0  # ticks at which the gate held transfers (Tick.held_ticks)
        transfers.resize(self.window)
        self.pending: deque[Transfer] = deque()
        # Bodies above --spool-above; `spooling` is its handles in flight, by handle.
        self.big = BigFiles(transfers, options)
        self.spooling = self.big.active
        # Under --concurrency auto, stragglers get a second try (second_tries.py); the two
        # collections are the ones the per-file path looks at (empty: nothing to do).
        self.second = SecondTries(transfers, self.spooling, self.pending, self.auto)
        self.twin, self.dropped = self.second.book.twin, self.second.book.dropped

    # -- feeding -------------------------------------------------------------------------
    @property
    def wants_pages(self) -> bool:
        gate = self.transfers.gate
        parked = gate.count if gate is not None else 0
        return len(self.pending) + len(self.big.sized) + parked < self.window

    @property
    def idle(self) -> bool:
        return self.pages.held == 0

    def add_page(self, page: Page) -> None:
        urls = self.source.plain_urls(page.names)
        if urls is not None:  # every name is plain: no per-name check, tuples built in C
            self._add_plain(page, urls)
            return
        # Resolved first: the sink is told the page's names (in listing order) as it begins.
        names, ready, refused, inline = resolve_items(self.source, page.names)
        state = self._begin(page, names)
        for name, reason, url in refused:
            self.transfers.fail(state, name, reason, 0, url)
        for name, url, body in inline:
            self._store_inline(state, name, url, body)
        queue = self.pending if self.spool_above else self.big.pending
        partials, resume = self.big.partials, self.big.resume
        if self.auto is not None and self.transfers.windows is None:
            self.auto.look_for_hosts(ready)
        sized = self.big.sized_streams(state, page)
        for name, url in ready:
            transfer = (state, name, url, 1)
            if partials and name in partials and resume(transfer):
                continue
            if sized is not None and sized(transfer):
                self.big.sized.append(transfer)
            else:
                queue.append(transfer)
        if state.remaining == 0 and state in self.pages.live:
            self.pages.finish(state)

    def _begin(self, page: Page, names: list[str] | tuple[str, ...]) -> PageState:
        state = self.pages.begin(page, names)
        if page.headers is not None:
            if self.conditional is None:  # the first conditional page: from now on
                self.conditional = ConditionalPages(self.transfers, self._completed,
                                                    self.spooling)
                self.on_completed = self.conditional.completed
            self.conditional.add(state, names, page.headers)
        return state

    def _add_plain(self, page: Page, urls: Iterable[str]) -> None:
        state = self._begin(page, page.names)
        # --spool-above 0: every body streams (libcurl reads MAXFILESIZE 0 as no limit).
        queue = self.pending if self.spool_above else self.big.pending
        sized = self.big.sized_streams(state, page)
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
            self.pages.finish(state)

    def _store_inline(self, state: PageState, name: str, url: str, body: bytes) -> None:
        """A body the listing carried (a data: URL): stored as fetched, checked by nobody."""
        try:
            state.write(name, body, None)
        except SinkFailure as exc:
            self.transfers.fail(state, name, str(exc), 0, url)
            return
        self.pages.stored(state, len(body))

    # -- the loop ------------------------------------------------------------------------
    def step(self, timeout: float) -> list[PageReport]:
        """Start what can start, move transfers on, and return the page reports that became
        durable since (see take_fetched() for pages that finished fetching)."""
        transfers = self.transfers
        if transfers.waiting:
            for transfer, big in transfers.due():
                (self.big.pending if big else self.pending).append(transfer)  # type: ignore[arg-type]
        multi, free, pending, transfer_of = self.multi, self.free, self.pending, self.transfer_of
        gate = transfers.gate
        if gate is not None and gate.count:
            for transfer, big in reversed(gate.release()):  # ahead of the later ones
                (self.big.pending if big else pending).appendleft(transfer)  # type: ignore[arg-type]
        if self.big.pending or self.big.sized:
            if self.controller is not None:  # big streams get handles beside the window
                big = self.big
                self._fit_pool(min(big.slots - len(self.spooling),
                                   len(big.pending) + len(big.sized)))
            self.big.start_some()
        request_headers = transfers.request_headers
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
        controller, stats = self.controller, self.stats
        handles = self.handles
        if controller is not None:
            controller.in_flight(len(handles) - len(free))
        pages = self.pages
        if len(free) < len(handles):
            self.dropped.clear()  # (what a twin's win dropped in an earlier batch is gone)
            while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            completed = self.on_completed
            while True:
                queued, succeeded, failed = multi.info_read()
                if controller is None and stats is None:
                    for handle in succeeded:
                        completed(handle, None)
                else:  # each one's time from start to end: the controller's latency
                    took = 0.0
                    windows = transfers.windows
                    for handle in succeeded:
                        seconds = handle.getinfo(_TOTAL_TIME)
                        took += seconds
                        if stats is not None:
                            stats.timed(seconds)
                        if windows is not None:
                            windows.completed(host_of(transfer_of[handle][2]), seconds)
                        completed(handle, None)
                    if controller is not None and succeeded:  # (not on a turn of none)
                        controller.completed(len(succeeded), took)
                        if controller.limit != self.window:  # grown as answers came
                            self._resize(controller.limit)
                for handle, code, message in failed:
                    if code in TLS_FATAL_ERRORS:  # only failures pay for this test
                        raise self._tls_fatal(handle, code, message)
                    if stats is not None:
                        stats.timed(handle.getinfo(_TOTAL_TIME))
                    completed(handle, (code, message))
                if not queued:
                    break
            if len(free) < len(handles) and not (pages.finished or pages.fetched):
                if self.spooling and len(self.spooling) + len(free) == len(handles):
                    self.big.nap()
                gate = transfers.gate
                if gate is not None and gate.count:  # a parked host's turn may come first
                    wake = gate.next_wake()
                    if wake is not None:
                        timeout = min(timeout, wake)
                # libcurl's own next deadline: a transfer --limit-rate holds back (or one
                # waiting to connect again) moves on a timer, not on a socket
                due_ms = multi.timeout()
                if 0 <= due_ms < timeout * 1000:
                    timeout = due_ms / 1000
                if len(handles) <= SELECT_SEES:
                    multi.select(timeout)
                else:  # see SELECT_SEES
                    timeout = min(timeout, HIGH_FD_WAIT_S)
                    began = time.monotonic()
                    # with no socket below 1024, pycurl's select() returns 0 at once
                    if multi.select(timeout) == 0 and time.monotonic() - began < timeout / 2:
                        time.sleep(timeout)
        elif self.big.ranged.files and self.big.ranged.wait_hashing(timeout):
            pass  # nothing in flight: waited for a split file's last bytes to hash
        # Transfers wait for their retry (a split file's pieces too: then no hash job runs,
        # and without the sleep the loop would spin until the retry is due).
        elif (transfers.waiting or (transfers.gate is not None and transfers.gate.count)) \
                and not (pages.finished or pages.fetched):
            time.sleep(min(timeout, transfers.next_due()))
        if self.big.ranged.files:
            self.big.ranged.poll()
        if self.spooling and self.big.pacing is not None:
            self.big.pacing.turn(self.spooling)
        if controller is not None:
            now = time.monotonic()
            if now >= self.second.book.next_scan and self.second.scan(now, self.window):
                self._fit_pool()
            if controller.due(now):
                self._resize(controller.decide(now))
            if transfers.windows is not None:
                rose, fell = transfers.windows.sweep()
                if rose:
                    transfers.gate.wake_hosts(rose)  # type: ignore[union-attr]
                for host, limit in fell:
                    self.second.above_limit(limit, host)
        return pages.take_finished()

    def _resize(self, limit: int) -> None:
        if limit < self.window and self.transfers.windows is None:
            self.second.above_limit(limit)
        self.window = limit
        self.peak_window = max(self.peak_window, limit)
        self._fit_pool()

    def _fit_pool(self, starting: int = 0) -> None:
        """--concurrency auto: handles for the window, and beside it for the big streams
        (those in flight and `starting` more) and the silent transfers excused from it
        (second_tries.py), never past the descriptors' ceiling (a stream holds a socket and
        a file: open_file_ceiling)."""
        wanted = self.window + len(self.spooling) + starting + self.second.excused
        self.transfers.resize(min(wanted, self.controller.ceiling))  # type: ignore[union-attr]

    def _completed(self, handle: pycurl.Curl, error: tuple[int, str] | None) -> None:
        """One transfer ended. The success path is written flat: it runs once per file."""
        if self.spooling and handle in self.spooling:
            self.big.completed(handle, error)
            return
        if self.dropped and handle in self.dropped:  # its twin answered first: taken back
            return
        if self.twin and handle in self.twin and not self.second.settle(handle, error):
            return
        self.multi.remove_handle(handle)
        transfer = self.transfer_of[handle]
        transfers = self.transfers
        if transfers.windows is not None:
            transfers.gate.done(transfer[2])  # type: ignore[union-attr]
        chunks, lines = self.buffers[handle]
        retry_after = None
        if error is not None:
            code, message = error
            if code == _TOO_BIG:  # not a failure: the body goes to a spool instead
                if transfers.gate is not None:  # (no byte of its body came: --limit-rate)
                    transfers.gate.ended(transfer[2], sent=False)
                self.big.too_big(transfer, lines)
                chunks.clear()
                lines.clear()
                self.free.append(handle)
                return
            retryable, reason = code in RETRYABLE_CURL_ERRORS, f"{message} (curl error {code})"
            if self.controller is not None and code in CONGESTION_CURL_ERRORS:
                self.auto.congested(transfer[2])
        elif handle.getinfo(pycurl.RESPONSE_CODE) == 200:
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            digest = validators = None
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
                        if self.keep_validators is not None:
                            validators = http_validators(lines, lowered)
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
                        transfers.fail(transfer[0], transfer[1], changed, transfer[3],
                                       transfer[2])
                        return
                    if listed[1] and digest is not None:
                        way = BY_DIGEST if listed[1].startswith(SHA256) else BY_MD5
            if reason is None:
                state = transfer[0]
                try:
                    state.write(transfer[1], body, digest)
                except SinkFailure as exc:
                    transfers.fail(state, transfer[1], str(exc), transfer[3], transfer[2])
                    return
                if validators is not None:
                    self.keep_validators(transfer[1], *validators)  # type: ignore[misc]
                self.checked[way] += 1
                state.bytes += len(body)
                if transfers.gate is not None:
                    transfers.gate.received(transfer[2], len(body))
                state.remaining -= 1
                if state.remaining == 0:
                    self.pages.finish(state)
                return
            transfers.retry_or_fail(transfer, reason, True, None)
            return
        else:
            status = handle.getinfo(pycurl.RESPONSE_CODE)
            if transfers.follows and status in REDIRECT_STATUSES:
                self._redirected(handle, transfer, header_value(lines, b"location"))
                return
            reauthorize = transfers.reauthorize
            retryable = retryable_status(status) or (
                status == 401 and reauthorize is not None and reauthorize(transfer[2]))
            reason = f"HTTP {status}" + error_code(chunks)
            if status in (429, 503):
                retry_after = retry_after_seconds(header_value(lines, b"retry-after"))
                if self.controller is not None:  # a pause asked for pauses the host: less
                    self.auto.congested(transfer[2], bool(retry_after))
        chunks.clear()
        lines.clear()
        self.free.append(handle)
        transfers.retry_or_fail(transfer, reason, retryable, retry_after)

    @staticmethod
    def _short(handle: pycurl.Curl, body: bytes) -> str | None:
        announced = handle.getinfo(pycurl.CONTENT_LENGTH_DOWNLOAD_T)
        if announced >= 0 and announced != len(body):
            return f"body of {len(body)} bytes, Content-Length {int(announced)}"
        return None

    def _redirected(self, handle: pycurl.Curl, transfer: Transfer,
                    location: str | None) -> None:
        """A redirect the engine follows itself (the source's requests carry the user's
        headers): the transfer again, at once, to the Location; at most MAX_HOPS hops,
        http(s) only."""
        chunks, lines = self.buffers[handle]
        chunks.clear()
        lines.clear()
        self.free.append(handle)
        state, name, url, attempt = transfer
        transfers = self.transfers
        if transfers.gate is not None:
            transfers.gate.ended(url)
        target, why = transfers.hop(state, name, url, location)
        if target is None:
            transfers.fail(state, name, why, attempt, url, in_gate=False)
            return
        self.pending.appendleft((state, name, target, attempt))

    def _tls_fatal(self, handle: pycurl.Curl, code: int, message: str) -> FatalTransferError:
        """The error that stops the run on a certificate libcurl refused: every other file
        from that host would fail the same way, so none is failed (its page stays not done;
        the rerun, once the certificate is trusted, fetches it)."""
        name, url = self.transfer_of[handle][1:3]
        url = handle.getinfo(pycurl.EFFECTIVE_URL) or url  # a redirect's target, if one
        return FatalTransferError(
            f"fetching {name!r}: {tls_failure(code, message, url, self.options.tls)}")

    def take_finished(self) -> list[PageReport]:
        """Durable page reports that step() has not returned (a SinkFatal cut it short)."""
        return self.pages.take_finished()

    def take_fetched(self) -> int:
        """Pages finished fetching since the last call (durable or not yet)."""
        return self.pages.take_fetched()

    # -- the coordinator's side ----------------------------------------------------------
    def tick(self) -> Tick:
        """The worker's counters now, for the coordinator (about every tenth of a second)."""
        transfers, big, book = self.transfers, self.big, self.second.book
        gate = transfers.gate
        if gate is not None and (gate.count or (big.pacing is not None and big.pacing.held)):
            self.held_ticks += 1
        partial, largest = 0, ()
        if self.spooling or big.ranged.files:  # (a ranged file's pieces may all wait)
            partial, entries = big.in_flight()
            largest = tuple(sorted(entries, key=largest_first)[:self.options.shown_in_flight])
        latency: tuple[int, ...] = ()
        latency_sum = 0.0
        hosts: tuple[tuple[str, int], ...] = ()
        host_limits: tuple[tuple[str, int], ...] = ()
        stats = self.stats
        if stats is not None:
            stats.count_hosts(time.monotonic(), transfers.urls_in_flight, self._limit_of())
            latency, latency_sum = tuple(stats.latency), stats.latency_sum
            hosts, host_limits = stats.hosts, stats.host_limits
        files_ok, nbytes = self.pages.in_hand()
        conditional = self.conditional
        return Tick(self.worker, files_ok=files_ok, files_failed=self.pages.files_failed,
                    bytes=nbytes, retries=transfers.retries, in_flight=transfers.in_flight,
                    partial_bytes=partial, largest=largest, ranged_restarts=big.restarts,
                    size_only=big.ranged.size_only, checked=tuple(self.checked),  # type: ignore[arg-type]
                    limit=self.window, peak_limit=self.peak_window, latency=latency,
                    latency_sum=latency_sum, hosts=hosts, host_limits=host_limits,
                    not_modified=conditional.not_modified if conditional is not None else 0,
                    same_bodies=conditional.same_bodies if conditional is not None else 0,
                    continued_bytes=big.ranged.continued, held_ticks=self.held_ticks,
                    hedged=book.hedged, hedges_won=book.won, redialed=book.redialed,
                    requeued=self.second.requeued,
                    learned=self.auto.learned_now() if self.auto is not None else ())

    def _limit_of(self) -> Callable[[str], int] | None:
        """Under --concurrency auto, a host's limit (one host alone: the worker's)."""
        return self.auto.limit_of(self.window) if self.auto is not None else None

    def set_rate_share(self, of_bytes: float, of_requests: float) -> None:
        """This worker's new shares of --limit-rate and --max-rps (Transfers.share_rates)."""
        if self.transfers.share_rates(of_bytes, of_requests) and self.big.pacing is not None:
            self.big.pacing.hold_again()

    # -- stopping ----------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self.transfers.in_flight

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
        self.second.clear()
        self.transfers.waiting.clear()
        if self.transfers.gate is not None:
            self.transfers.gate.clear()

    def close(self) -> None:
        self.abandon()
        self.big.close()
        self.transfers.close()
