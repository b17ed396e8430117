"""What every transfer of a worker shares, small body or big: the curl multi and its pool of
handles, the headers each request carries (the source's Abilities), the per-host gate, and
what becomes of a transfer that stored nothing (another attempt after a backoff, a server's
Retry-After pausing its whole host, or a failure recorded for its page).

The small-file path (fetcher.py) and the big bodies (big.py) each hold the one Transfers of
their worker; neither reaches into the other.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import pycurl

from bulkfetch.config import GetOptions
from bulkfetch.engine.host_windows import HostWindows
from bulkfetch.engine.hosts import HostGate
from bulkfetch.engine.pages import Pages, PageState
from bulkfetch.engine.stated import SHA256
from bulkfetch.net.curl import new_handle
from bulkfetch.net.redirects import MAX_HOPS, next_hop
from bulkfetch.sources.abilities import LISTING, Abilities, Pinned


class Transfers:
    def __init__(self, options: GetOptions, abilities: Abilities, pages: Pages,
                 rng: random.Random | None = None) -> None:
        limits = options.limits
        self.options = options
        self.pages = pages
        self.sink = pages.sink
        self.verify = options.verify
        self.policy = options.retry
        self.rng = rng or random.Random()
        self.multi = pycurl.CurlMulti()
        if limits.per_host:
            self.multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, limits.per_host)
        self.spool_above = limits.spool_above
        # The pool. These containers are shared (the fetcher keeps them in attributes of
        # its own for its loop) and never replaced, only changed in place.
        self.handles: list[pycurl.Curl] = []
        self.free: list[pycurl.Curl] = []
        # Per-handle state lives in dicts keyed by the handle: an attribute on a pycurl
        # object costs a failed generic lookup (an AttributeError built and dropped) first.
        self.buffers: dict[pycurl.Curl, tuple[list[bytes], list[bytes]]] = {}
        self.transfer_of: dict[pycurl.Curl, Any] = {}
        # -- the source's abilities --
        # What every request of this source needs (an S3 source: its checksum header),
        # set once per handle; a piece of a big file adds its Range to the headers.
        self.source_options: list[tuple[int, Any]] = list(abilities.curl_options)
        self.base_headers: list[str] = next(
            (value for option, value in self.source_options if option == pycurl.HTTPHEADER),
            [])
        # A source whose every request carries headers chosen for it (S3 signed anew, a
        # registry's token, the user's headers by host): url -> the request's headers.
        self.sign: Callable[[str], list[str]] | None = abilities.request_headers
        # The headers set on each transfer as it starts, when some are per transfer: signed
        # ones, or a cache's page's (conditional.py); None: the handle's own stay.
        sign = self.sign
        self.request_headers: Callable[[Any], list[str]] | None = \
            (lambda transfer: sign(transfer[2])) if sign is not None else None
        # name -> the size and digest the source vouches for (a registry's blobs)
        self.pinned: Callable[[str], Pinned | None] | None = abilities.pinned
        # url -> whether a 401 there is worth another attempt with renewed credentials
        self.reauthorize: Callable[[str], bool] | None = abilities.reauthorize
        # url -> the URL and headers of the request asking an object's part layout (S3)
        self.layout_request = abilities.layout_request
        # The source's requests carry the user's headers: libcurl's redirects are off and
        # the engine follows each hop itself (hop()). A signed S3 source turns them off
        # too, and wants a 3xx to stay a failure (the bucket is elsewhere).
        self.follows = abilities.follows_redirects
        # -- hosts --
        # Per-host pauses (Retry-After), --max-rps and --limit-rate (a worker's share of
        # each); made on the first Retry-After when no limit asks for it from the start.
        self.gate: HostGate | None = HostGate(
            limits.max_rps / limits.workers, limits.limit_rate / limits.workers) \
            if limits.max_rps or limits.limit_rate else None
        # Under --concurrency auto, from a worker's second host on: each host's own limit
        # (host_windows.py), kept by the gate.
        self.windows: HostWindows | None = None
        # --limit-rate: the worker's share, the most one body may take (libcurl's cap)
        self.handle_rate = max(1, limits.limit_rate // limits.workers) \
            if limits.limit_rate else 0
        # -- retries: a heap by due time of (due, order, transfer, a big body's) --
        self.waiting: list[tuple[float, int, tuple[object, ...], bool]] = []
        self.order = itertools.count()
        self.retries = 0
        self.checked = [0, 0, 0]  # stored bodies by how they were checked: BY_MD5 ...

    # -- the pool --------------------------------------------------------------------------
    def new_handle(self) -> pycurl.Curl:
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

    def resize(self, limit: int) -> None:
        """Keep `limit` handles: new ones join the idle pool; idle ones beyond the limit are
        closed now, busy ones at a later resize (in flight never exceeds the pool)."""
        handles = self.handles
        if limit == len(handles):
            return
        if limit > len(handles):
            grown = [self.new_handle() for _ in range(limit - len(handles))]
            self.free.extend(grown)
            handles.extend(grown)
        elif limit < len(handles) and self.free:
            surplus = min(len(handles) - limit, len(self.free))
            dropped = self.free[-surplus:]
            del self.free[-surplus:]
            gone = set(dropped)
            handles[:] = [handle for handle in handles if handle not in gone]
            for handle in dropped:
                del self.buffers[handle]
                handle.close()
        # The multi keeps connections in a cache of its own, closed handles' too: as many
        # as the pool, so sockets never outnumber the handles the descriptors were
        # budgeted for (adaptive.open_file_ceiling) after the pool shrank or churned.
        self.multi.setopt(pycurl.M_MAXCONNECTS, max(1, len(handles)))

    @property
    def in_flight(self) -> int:
        return len(self.handles) - len(self.free)

    def urls_in_flight(self) -> list[str]:
        idle = set(self.free)
        return [self.transfer_of[handle][2] for handle in self.handles if handle not in idle]

    def sign_with(self, sign: Callable[[str], list[str]],
                  options: Sequence[tuple[int, Any]] = ()) -> None:
        """From now on every transfer's headers come from `sign(url)` (a Client given its
        first s3:// URL), and `options` hold for every handle, those made already and those
        to come."""
        self.sign = sign
        if self.request_headers is None:  # (a cache's page headers ask self.sign itself)
            self.request_headers = lambda transfer: sign(transfer[2])
        self.source_options = [*self.source_options, *options]
        for handle in self.handles:
            for option, value in options:
                handle.setopt(option, value)

    def cap_rate(self, rate: float) -> None:
        """The worker's share of --limit-rate is now `rate` bytes/s: its hosts' byte buckets
        and every handle's cap follow (between turns of the multi: no callback runs now)."""
        assert self.gate is not None
        self.gate.set_byte_rate(rate)
        self.handle_rate = max(1, int(rate))
        for handle in self.handles:
            handle.setopt(pycurl.MAX_RECV_SPEED_LARGE, self.handle_rate)

    def share_rates(self, of_bytes: float, of_requests: float) -> bool:
        """This worker's new shares (fractions) of --limit-rate, which its hosts' byte
        buckets and every handle's cap follow, and of --max-rps (runners/rate_shares.py).
        True when the byte rate moved (streams held for the old one may go again)."""
        gate, limits = self.gate, self.options.limits
        if gate is None:
            return False
        if limits.max_rps and gate.max_rps > 0:
            requests = max(0.01, limits.max_rps * of_requests)
            if abs(requests - gate.max_rps) >= 0.01 * limits.max_rps:
                gate.set_request_rate(requests)
        rate = limits.limit_rate
        if not rate or gate.byte_rate <= 0:
            return False
        new = max(1.0, rate * of_bytes)
        if abs(new - gate.byte_rate) < 0.01 * rate:
            return False
        self.cap_rate(new)
        return True

    # -- what the source vouches for ------------------------------------------------------
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

    # -- redirects the engine follows itself (self.follows) --------------------------------
    def hop(self, state: PageState, name: str, url: str,
            location: str | None) -> tuple[str | None, str]:
        """(where the redirect from `url` to `location` leads, ""), counted against the
        item's hops (a retry starts again from its listed URL: retry_or_fail), or (None,
        why it is not followed): not http(s), or more than MAX_HOPS."""
        if state.hops is None:
            state.hops = {}
        listed_url, count = state.hops.get(name, (url, 0))
        target, why = next_hop(url, location)
        if target is None or count >= MAX_HOPS:
            return None, why or f"more than {MAX_HOPS} redirects"
        state.hops[name] = (listed_url, count + 1)
        return target, ""

    # -- a transfer that stored nothing ---------------------------------------------------
    def retry_or_fail(self, transfer: Any, reason: str, retryable: bool,
                      retry_after: float | None, big: bool = False) -> None:
        state, name, url, attempt = transfer
        if retryable and attempt <= self.policy.retries:
            if state.hops and name in state.hops:  # from the listed URL again
                url = state.hops.pop(name)[0]
            self.retry_later((state, name, url, attempt + 1), attempt, retry_after, big)
        else:
            self.fail(state, name, reason, attempt, url, in_gate=not big)

    def retry_later(self, transfer: tuple[object, ...], attempt: int,
                    retry_after: float | None, big: bool) -> None:
        """Queue `transfer` (the next attempt) after the backoff for retry `attempt`."""
        delay = self.policy.delay(attempt, retry_after, self.rng)
        if self.gate is not None and not big:
            self.gate.ended(str(transfer[2]))
        if retry_after:  # the server asked to be left alone: the whole host, not one file
            if self.gate is None:
                self.gate = HostGate()
            self.gate.pause(str(transfer[2]), delay)
        self.retries += 1
        heapq.heappush(self.waiting, (time.monotonic() + delay, next(self.order), transfer, big))

    def fail(self, state: PageState, name: str, reason: str, attempts: int,
             url: str = "", in_gate: bool = True) -> None:
        """`name` of `state`'s page failed. `in_gate` False: the host gate does not count
        the transfer as a small one in flight (a big body's, or one it was told had
        ended)."""
        if self.gate is not None and url and attempts and in_gate:  # 0: it never started
            self.gate.ended(url)
        self.pages.failed(state, name, reason, attempts, url)

    def due(self) -> list[tuple[tuple[object, ...], bool]]:
        """The transfers whose retry is due now, each with whether it is a big body's."""
        waiting = self.waiting
        now = time.monotonic()
        ready = []
        while waiting and waiting[0][0] <= now:
            _, _, transfer, big = heapq.heappop(waiting)
            ready.append((transfer, big))
        return ready

    def next_due(self) -> float:
        """Seconds until a retry is due or a parked host may be asked again."""
        due = max(0.0, self.waiting[0][0] - time.monotonic()) if self.waiting else None
        wake = self.gate.next_wake() if self.gate is not None else None
        return min((seconds for seconds in (due, wake) if seconds is not None), default=0.0)

    def close(self) -> None:
        for handle in self.handles:
            handle.close()
        self.multi.close()
