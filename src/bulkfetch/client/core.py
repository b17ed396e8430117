"""`bulkfetch.Client`: many URLs' bodies handed to a Python program, from one libcurl loop.

The usual answer to "read many objects fast" from Python is a ThreadPoolExecutor over
requests or boto3: a thread per request in flight, the GIL taken back for every chunk. A
Client drives the engine's Fetcher (the CLI's retries, verification, per-host limits and
`--concurrency auto`) on one background thread, where libcurl waits with the GIL released,
and hands each body to the call that asked for it. Calls may come from many threads at
once and from asyncio (`aget_many`, `aget`); they share the loop and its connections.

A call's URLs go to the loop in pages of PAGE_URLS, and at most `window` of its URLs are
in hand at once (sent, not yet taken by the caller), so a slow consumer slows the fetching
and memory stays bounded whatever the number of URLs.

Two caches may stand in front of the loop, memory first: `cache_bytes` (memcache.py:
bodies for `cache_ttl` seconds, whatever the server said) and `cache_dir` (httpcache.py: an
HTTP cache on disk that honours Cache-Control, Expires, ETag and Last-Modified, revalidates
with conditional requests, and is shared by processes and kept across restarts).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, Literal

from bulkfetch.client.disk_layer import Answer, DiskLayer, NotModified
from bulkfetch.client.httpcache import Entry, HttpCache
from bulkfetch.client.memcache import MemoryCache
from bulkfetch.client.s3_urls import S3Urls
from bulkfetch.errors import BulkfetchError, FetchError
from bulkfetch.models import Page, PageReport
from bulkfetch.sinks.base import SinkAbilities
from bulkfetch.sinks.null import NullSink
from bulkfetch.sinks.spool import MemorySpool
from bulkfetch.sources.abilities import Abilities

__all__ = ["Client", "FetchError"]

PAGE_URLS = 256  # URLs per page handed to the loop: small enough to start at once
STEP_S = 0.01  # the loop's wait while transfers are in flight (how soon new work starts)




class _Call:
    """One get_many(): its URLs by position, and what came back, in arrival order."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.urls: dict[int, str] = {}
        # what came back, a batch per turn of the loop (one hand-over between threads for
        # many bodies: one each cost more than the rest of the file's way together)
        self.results: queue.SimpleQueue[list[tuple[int, bytes | FetchError]]] = \
            queue.SimpleQueue()


class _Source:
    """Page items are "CALL/POSITION"; the call knows the URL. Names stay plain and unique."""

    def __init__(self, calls: dict[int, _Call]) -> None:
        self.calls = calls
        # s3:// URLs: set by the caller's thread before the first page holding one is sent
        self.s3: S3Urls | None = None

    def describe(self) -> str:
        return "bulkfetch.Client"

    def plain_urls(self, items: Sequence[str]) -> None:
        return None

    def abilities(self) -> Abilities:
        return Abilities()  # s3:// URLs are signed once one comes (Transfers.sign_with)

    def resolve(self, item: str) -> tuple[str, str]:
        call, _, position = item.partition("-")
        found = self.calls.get(int(call))
        if found is None:  # the caller stopped reading that call: nothing to fetch
            raise ValueError("the call was abandoned")
        url = found.urls[int(position)]
        if url.startswith("s3://") and self.s3 is not None:
            return item, self.s3.object_url(url)
        return item, url


class _Deliver(NullSink):
    """The Fetcher's sink: each body, and each failure once its page reports it, goes to
    the call that asked for it. (Nothing to make durable: the rest is the null sink's.)"""

    abilities = SinkAbilities()  # each body goes to the call that asked for it

    def __init__(self, calls: dict[int, _Call]) -> None:
        self.calls = calls
        self.out: dict[_Call, list[tuple[int, bytes | FetchError]]] = {}

    def _put(self, name: str, result: bytes | FetchError) -> None:
        call, _, position = name.partition("-")
        found = self.calls.get(int(call))
        if found is not None:  # (a call the caller abandoned takes nothing)
            batch = self.out.get(found)
            if batch is None:
                batch = self.out[found] = []
            batch.append((int(position), result))

    def hand_over(self) -> None:
        """Give each call what came back for it since the last hand-over."""
        if self.out:
            out, self.out = self.out, {}
            for call, batch in out.items():
                call.results.put(batch)

    def _write(self, name: str, body: bytes, md5: str | None) -> None:
        self._put(name, body)

    def begin_page(self, seq: int, names: Sequence[str] = ()) -> Any:
        return self._write

    # skip(): a failure's reason comes with its page's report (end_page)

    def open_spool(self, name: str) -> MemorySpool:  # type: ignore[override]
        return MemorySpool()

    def store_spool(self, seq: int, name: str, spool: MemorySpool,  # type: ignore[override]
                    size: int, md5: str) -> None:
        self._put(name, b"".join(spool.chunks))
        spool.discard()

    def end_page(self, report: PageReport) -> list[PageReport]:
        for failure in report.failures:
            call, _, position = failure.name.partition("-")
            found = self.calls.get(int(call))
            if found is not None:
                url = found.urls.get(int(position), failure.url)
                self._put(failure.name, FetchError(url, failure.reason, failure.attempts))
        return [report]


class _DeliverCached(_Deliver):
    """_Deliver for a Client with a disk cache: a body goes with its response's header
    lines (an Answer), and a 304 as a NotModified; the caller's thread settles both with
    the cache (disk_layer.py). The fetcher hands the lines over first (engine/fetcher.py:
    _completed_cached) and clears its own list after: they are copied."""

    def __init__(self, calls: dict[int, _Call]) -> None:
        super().__init__(calls)
        self.lines: dict[str, list[bytes]] = {}  # by name, until its body is written

    def response_headers(self, name: str, lines: list[bytes]) -> None:
        self.lines[name] = list(lines)

    def not_modified(self, name: str, lines: list[bytes]) -> None:
        self._put(name, NotModified(list(lines)))  # type: ignore[arg-type]

    def _write(self, name: str, body: bytes, md5: str | None) -> None:
        self._put(name, Answer(body, self.lines.pop(name, None), md5))  # type: ignore[arg-type]

    def store_spool(self, seq: int, name: str, spool: MemorySpool,  # type: ignore[override]
                    size: int, md5: str) -> None:
        self._write(name, b"".join(spool.chunks), md5)
        spool.discard()

    def end_page(self, report: PageReport) -> list[PageReport]:
        for failure in report.failures:  # (headers of a 200 whose body failed its checks)
            self.lines.pop(failure.name, None)
        return super().end_page(report)


class Client:
    """Fetch many URLs concurrently into this process.

    Keyword options are those of `bulkfetch.download()` that concern transfers:
    `concurrency` ("auto" or a number), `max_concurrency`, `per_host`, `max_rps`,
    `limit_rate`, `retries`, `max_retry_wait`, `connect_timeout`, `idle_timeout`,
    `total_timeout`, `min_speed`, `verify`, `ca_bundle`, `insecure`; for s3://BUCKET/KEY
    URLs, `endpoint_url`, `region`, `profile`, `no_sign_request`, `addressing_style`
    (credentials as the AWS tools find them; see s3_urls.py). `window`: at most this
    many URLs of one call in hand at once (sent to the loop, not yet taken). `cache_bytes`:
    keep bodies in memory up to this many bytes (least recently used dropped first), each
    for `cache_ttl` seconds (None: until dropped); a URL kept is answered without a
    request. `client.cache` has the counts (hits, misses).

    `cache_dir`: an HTTP cache in that directory (httpcache.py, rules in freshness.py),
    asked after the memory cache: a fresh entry answers without a request; a stale one is
    revalidated (If-None-Match / If-Modified-Since; a 304 renews it and transfers no
    body); a 200 is kept as its Cache-Control / Expires allow (no-store: never; no-cache:
    always revalidated). `cache_dir_ttl`: seconds a response that states no freshness of
    its own (no max-age, no Expires: most static servers) stays fresh; None: it is
    revalidated on every use. `cache_dir_bytes` bounds the bodies kept (least recently used
    evicted first). Processes may share the directory; it survives restarts. Bodies split
    into ranges (above `split_above`) are not kept. `client.disk_cache` has the counts
    (hits, stale, misses, revalidated, stored, evicted); `cache_stats()` all of them.

        with bulkfetch.Client() as client:
            for url, body in client.get_many(urls):
                ...
    """

    def __init__(self, *, window: int = 8192, cache_bytes: int = 0,
                 cache_ttl: float | None = None,
                 cache_dir: str | os.PathLike[str] | None = None,
                 cache_dir_bytes: int = 1 << 30, cache_dir_ttl: float | None = None,
                 **options: Any) -> None:
        from bulkfetch.api import build_options, python_terms
        from bulkfetch.engine.fetcher import Fetcher

        if window < 1:
            raise ValueError("window must be at least 1")
        self.window = window
        self.cache = MemoryCache(cache_bytes, cache_ttl) if cache_bytes else None
        self.disk_cache = HttpCache(cache_dir, cache_dir_bytes, cache_dir_ttl) \
            if cache_dir is not None else None
        self.disk = DiskLayer(self.disk_cache) if self.disk_cache is not None else None
        self.requested = 0  # URLs handed to the loop (a cache hit, or a repeat, is not)
        with python_terms():
            self.options = build_options("bulkfetch.Client", os.devnull, workers=1, **options)
        self.calls: dict[int, _Call] = {}
        self.numbers = itertools.count()
        self.pages = itertools.count()
        self.inbox: queue.SimpleQueue[Page | None] = queue.SimpleQueue()
        self.deliver = _Deliver(self.calls) if self.disk is None else \
            _DeliverCached(self.calls)
        self.source = _Source(self.calls)
        self.s3_lock = threading.Lock()
        self.signing: S3Urls | None = None  # to hand to the fetcher on the loop's thread
        self.fetcher = Fetcher(self.options, self.source,  # type: ignore[arg-type]
                               self.deliver)  # type: ignore[arg-type]
        self.error: BaseException | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="bulkfetch-client",
                                       daemon=True)
        self.thread.start()

    # -- the background loop -------------------------------------------------------------
    def _loop(self) -> None:
        fetcher, inbox = self.fetcher, self.inbox
        held: deque[Page] = deque()
        try:
            while True:
                if fetcher.idle and not held:
                    page = inbox.get()  # nothing in flight: sleep until work comes
                    if page is None:
                        return
                    held.append(page)
                while True:  # everything sent since
                    try:
                        page = inbox.get_nowait()
                    except queue.Empty:
                        break
                    if page is None:
                        return
                    held.append(page)
                if self.signing is not None:  # the first s3:// URL with credentials
                    fetcher.transfers.sign_with(self.signing.sign, self.signing.curl_options())
                    self.signing = None
                while held and fetcher.wants_pages:
                    fetcher.add_page(held.popleft())
                fetcher.step(STEP_S)
                fetcher.take_fetched()
                self.deliver.hand_over()
        except BaseException as exc:
            self.error = exc
        finally:
            # The loop is gone (closed, or failed): a call waiting in another thread must
            # hear it, not wait for ever. What was not handed over is lost with the rest.
            if self.error is None:
                self.error = BulkfetchError("the Client was closed")
            self.deliver.out.clear()
            for call in list(self.calls.values()):
                call.results.put([(position, FetchError(
                    url, f"the client's loop stopped: {self.error}", 0))
                    for position, url in list(call.urls.items())])
            self.fetcher.close()

    def _send(self, call: _Call, batch: list[tuple[int, str]],
              stale: dict[int, Entry] | None = None) -> None:
        """`batch` (position, url) to the loop; with a disk cache, `stale`: the entries to
        revalidate by position (their conditional headers ride in the page)."""
        if self.source.s3 is None and any(url.startswith("s3://") for _, url in batch):
            self._start_s3()
        for position, url in batch:
            call.urls[position] = url
        names = tuple(f"{call.number}-{position}" for position, _ in batch)
        self.requested += len(batch)
        headers = None
        if stale is not None:  # a disk cache's page, even with no conditional request
            headers = tuple(DiskLayer.request_headers(stale.get(position))
                            for position, _ in batch)
        self.inbox.put(Page(next(self.pages), None, names, headers=headers))

    def _start_s3(self) -> None:
        """The S3 settings, found at the first s3:// URL (raises UsageError to the caller
        when they cannot be); with credentials, the loop signs from its next turn on."""
        with self.s3_lock:
            if self.source.s3 is None:
                urls = S3Urls(self.options.s3)
                if urls.signs:
                    self.signing = urls
                self.source.s3 = urls

    # -- the caller's side ---------------------------------------------------------------
    def get_many(self, urls: Iterable[str], *, ordered: bool = False,
                 errors: Literal["raise", "return"] = "raise",
                 ) -> Iterator[tuple[str, bytes | FetchError]]:
        """Yield (url, body) for every URL: as they arrive, or in the order given with
        `ordered=True`. A URL that fails raises FetchError (`errors="raise"`, the rest of
        the call is dropped) or is yielded as (url, FetchError) (`errors="return"`)."""
        if errors not in ("raise", "return"):
            raise ValueError(f"errors must be 'raise' or 'return', not {errors!r}")
        if self.closed:
            raise BulkfetchError("this Client is closed")
        if self.error is not None:
            raise BulkfetchError(f"the client's loop stopped: {self.error}")
        call = _Call(next(self.numbers))
        self.calls[call.number] = call
        source = enumerate(urls)
        # Only this thread sends and takes for this call: counts, not a semaphore. `taken`
        # counts what left the loop's hands (and, ordered, was yielded).
        sent = taken = 0
        window = self.window
        exhausted = False
        # ordered=True: what arrived ahead of its turn, by position
        waiting: dict[int, tuple[str, bytes | FetchError]] = {}
        cache, disk = self.cache, self.disk
        caching = cache is not None or disk is not None
        # With a cache, a URL already on its way for this call is not asked for again: its
        # later positions wait for the same answer (url -> those positions).
        coming: dict[str, list[int]] = {}
        # With a disk cache: its stale entries asked about, by position (what a 304 renews)
        stale: dict[int, Entry] | None = {} if disk is not None else None

        def drain() -> Iterator[tuple[str, bytes | FetchError]]:
            """ordered=True: what is next in the order given, as far as it has arrived."""
            nonlocal taken
            while taken in waiting:
                url, result = waiting.pop(taken)
                taken += 1
                yield self._outcome(url, result, errors)

        def arrived(position: int, url: str, result: bytes | FetchError,
                    ) -> Iterator[tuple[str, bytes | FetchError]]:
            nonlocal taken
            if ordered:  # (what waits for its turn counts as in hand: bounded)
                waiting[position] = (url, result)
                yield from drain()
            else:
                taken += 1
                yield self._outcome(url, result, errors)

        try:
            while True:
                batch: list[tuple[int, str]] = []
                while not exhausted and len(batch) < PAGE_URLS and \
                        sent + len(batch) - taken < window:
                    try:
                        position, url = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    if not isinstance(url, str):
                        raise TypeError(f"URLs must be str, got {type(url).__name__}")
                    if not caching:
                        batch.append((position, url))
                        continue
                    kept = cache.get(url) if cache is not None else None
                    if kept is None and disk is not None and url not in coming:
                        found = disk.lookup(url)
                        if isinstance(found, bytes):
                            kept = found
                            if cache is not None:
                                cache.put(url, found)
                        elif found is not None:
                            stale[position] = found  # type: ignore[index]
                    if kept is not None:
                        sent += 1  # answered at once, without a request
                        yield from arrived(position, url, kept)
                    elif url in coming:
                        sent += 1  # answered with the request already on its way
                        coming[url].append(position)
                    else:
                        coming[url] = []
                        batch.append((position, url))
                if batch:
                    self._send(call, batch, stale)
                    sent += len(batch)
                    if len(batch) == PAGE_URLS and not exhausted:
                        continue  # more to send while there is room
                if exhausted and taken == sent:
                    return
                if self.error is not None and call.results.empty():
                    raise BulkfetchError(f"the client's loop stopped: {self.error}")
                urls = call.urls
                results: list[Any] = call.results.get()
                if disk is not None:
                    results, again = disk.settle(results, urls, stale)  # type: ignore[arg-type]
                    if again:  # a 304 for an entry gone meanwhile: asked for again, plainly
                        self._send(call, [(position, urls[position]) for position in again],
                                   {})
                for position, result in results:
                    url = urls.pop(position)
                    if caching:
                        if isinstance(result, bytes) and cache is not None:
                            cache.put(url, result)
                        for later in coming.pop(url, ()):
                            yield from arrived(later, url, result)
                    elif not ordered:  # the plain case, inline: it runs once per body
                        taken += 1
                        if isinstance(result, FetchError) and errors == "raise":
                            raise result
                        yield url, result
                        continue
                    yield from arrived(position, url, result)
        finally:
            self.calls.pop(call.number, None)

    @staticmethod
    def _outcome(url: str, result: bytes | FetchError,
                 errors: str) -> tuple[str, bytes | FetchError]:
        if isinstance(result, FetchError) and errors == "raise":
            raise result
        return url, result

    def get(self, url: str) -> bytes:
        """The body of `url`; raises FetchError when it cannot be fetched."""
        for _, body in self.get_many((url,)):
            return body  # type: ignore[return-value]
        raise AssertionError("unreachable: get_many yields once per URL")

    async def aget_many(self, urls: Iterable[str], *, ordered: bool = False,
                        errors: Literal["raise", "return"] = "raise",
                        ) -> AsyncIterator[tuple[str, bytes | FetchError]]:
        """get_many() for asyncio: `async for url, body in client.aget_many(urls)`. The
        waiting happens on a worker thread; the event loop stays free."""
        results = self.get_many(urls, ordered=ordered, errors=errors)
        done = object()
        try:
            while True:
                item = await asyncio.to_thread(next, results, done)
                if item is done:
                    return
                yield item  # type: ignore[misc]
        finally:
            await asyncio.to_thread(results.close)

    async def aget(self, url: str) -> bytes:
        return await asyncio.to_thread(self.get, url)

    def cache_stats(self) -> dict[str, int]:
        """The caches' counts so far: memory_* (hits, misses) and disk_* (hits, stale,
        misses, revalidated: 304s, stored, evicted, asked_again: a 304 for an entry
        another process replaced or evicted meanwhile, errors: the cache failing, which
        costs a miss, never a body), with `requested`."""
        stats = {"requested": self.requested}
        if self.cache is not None:
            stats |= {"memory_hits": self.cache.hits, "memory_misses": self.cache.misses}
        if self.disk_cache is not None and self.disk is not None:
            disk = self.disk_cache
            stats |= {"disk_hits": disk.hits, "disk_stale": disk.stale,
                      "disk_misses": disk.misses, "disk_revalidated": disk.revalidated,
                      "disk_stored": disk.stored, "disk_evicted": disk.evicted,
                      "disk_asked_again": self.disk.asked_again,
                      "disk_errors": self.disk.errors}
        return stats

    def close(self) -> None:
        """Stop the loop (transfers in flight are dropped); the Client cannot be used after."""
        if not self.closed:
            self.closed = True
            self.inbox.put(None)
            self.thread.join()
            if self.disk_cache is not None:
                self.disk_cache.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
