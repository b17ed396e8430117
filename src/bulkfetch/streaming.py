"""`bulkfetch.stream()`: the multi-process engine, with the bodies handed to the caller.

The classic trap of Python's multiprocessing is a pool whose results are pickled one by one
across the process boundary: for small files that costs more than fetching them, and the
pool ends up slower than one process. Here W worker processes run the engine as `bulkfetch
get` does (the same lister, fetchers, retries and verification) with a sink that sends each
page's bodies up as one message: names NUL-joined, sizes, and one buffer of the bodies end
to end (sinks/stream.py). The caller's process slices that buffer into (name, bytes).

Bounded: at most `pages_ahead` pages (default 8 per worker + 2) are out, and a page goes out
only when one came back; a caller that stops reading stops the pipe, then the workers. A
stream keeps nothing on disk and is not resumed: for that, `bulkfetch get` into a DEST.
"""

from __future__ import annotations

import os
import queue
import time
from array import array
from collections.abc import Iterator
from typing import Any, Literal

from bulkfetch.errors import BulkfetchError, FetchError, UsageError
from bulkfetch.models import Page

__all__ = ["Stream", "stream"]

# Options of build_options() a stream decides itself (it has no DEST, runs its own pool).
_NOT_FOR_A_STREAM = ("dest", "sink", "fanout", "shard_files", "shard_size", "restart",
                     "retry_failed", "metrics", "runner", "ray_address")
DRAIN_S = 10.0  # at the end, seconds to wait for the workers to say they exit


def stream(source: str, *, workers: int | None = None,
           errors: Literal["raise", "return"] = "raise", **options: Any) -> Stream:
    """Every file `source` lists, fetched by `workers` processes (default: one per CPU),
    yielded as (name, body) in the order they arrive.

    `source` is what `bulkfetch.download()` takes: a listing API URL, `s3://BUCKET/PREFIX`,
    or with `from_file=True` a URL list or table. Keyword options are build_options()'s
    that concern listing and transfers (concurrency, retries, timeouts, verify, the listing
    shape, S3 and TLS settings, pages_ahead). A file that fails after its retries raises
    FetchError (`errors="raise"`; the stream is then over) or is yielded as (name,
    FetchError) (`errors="return"`).

        with bulkfetch.stream("http://host/list", workers=4) as files:
            for name, body in files:
                ...
    """
    return Stream(source, workers=workers, errors=errors, **options)


class Stream:
    """An iterator of (name, bytes); close() (or leaving a `with`) stops the workers.
    `files`, `bytes` and `failed` count what was yielded so far."""

    def __init__(self, source: str, *, workers: int | None = None,
                 errors: Literal["raise", "return"] = "raise", one_by_one: bool = False,
                 **options: Any) -> None:
        """`one_by_one`: each body its own message (the usual multiprocessing design),
        for benchmarks/stream.py to measure against; never faster."""
        from bulkfetch.api import build_options, python_terms

        if errors not in ("raise", "return"):
            raise ValueError(f"errors must be 'raise' or 'return', not {errors!r}")
        given = sorted(set(options) & set(_NOT_FOR_A_STREAM))
        if given:
            raise UsageError(f"bulkfetch.stream() does not take {', '.join(given)}: a stream "
                             "keeps nothing on disk (use bulkfetch.download() for a DEST)")
        with python_terms():
            self.options = build_options(source, os.devnull, workers=workers,
                                         sink="stream-each" if one_by_one else "stream",
                                         **options)
        self.errors = errors
        self.files = self.bytes = self.failed = 0
        self._results = self._run()

    def __iter__(self) -> Iterator[tuple[str, bytes | FetchError]]:
        return self._results

    def __next__(self) -> tuple[str, bytes | FetchError]:
        return next(self._results)

    def close(self) -> None:
        """Stop listing and fetching; transfers in flight are dropped."""
        self._results.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the run -------------------------------------------------------------------------
    def _run(self) -> Iterator[tuple[str, bytes | FetchError]]:
        from bulkfetch.listing.range_lister import lister_from_start
        from bulkfetch.runners.pool import ProcessPool
        from bulkfetch.runners.rate_shares import RateShares
        from bulkfetch.sources import make_source

        options = self.options
        source = make_source(options)
        pool = ProcessPool(options)
        # --limit-rate / --max-rps moved to the workers that wait on them, as get does
        balancer = RateShares.of_run(options.limits)
        ticks: dict[int, Any] = {}
        lister = lister_from_start(source, options)
        ahead = options.limits.max_pages_out
        pages_out = 0
        listing_over = finished = False
        pool.start()
        try:
            lister.start()
            while True:
                if not listing_over and pages_out < ahead:
                    pages_out, listing_over = _dispatch(lister, pool, pages_out, ahead)
                if listing_over and pages_out == 0:
                    finished = True
                    return
                if not listing_over and not lister.is_alive() and lister.out.empty():
                    raise BulkfetchError(f"the listing of {source.describe()} stopped "
                                         "unexpectedly")
                starving = not listing_over and pages_out == 0  # waited on the lister
                for message in pool.receive(0.0 if starving else 0.05):
                    kind = message[0]
                    if kind == "bodies":
                        yield from self._bodies(message[2], message[3], message[4])
                    elif kind == "body":
                        self.files += 1
                        self.bytes += len(message[2])
                        yield message[1], message[2]
                    elif kind == "tick":
                        ticks[message[1].worker] = message[1]
                    elif kind == "pages":
                        pages_out -= message[1]
                        for report in message[2]:
                            for failure in report.failures:
                                yield from self._failed(failure)
                    elif kind == "lost":  # a worker killed (the OOM killer) or frozen:
                        # its pages' bodies may be half given already, so no second try
                        raise BulkfetchError(f"worker {message[1]} lost ({message[4]}); the "
                                             "stream stops")
                    elif kind == "fatal":  # ("fatal", message[, usage])
                        error = UsageError if len(message) > 2 and message[2] else \
                            BulkfetchError
                        raise error(message[1])
                if balancer is not None:
                    shares = balancer.look(ticks.values(), time.monotonic())
                    if shares is not None:
                        pool.share_rate(shares)
                dead = pool.dead()
                if dead is not None:
                    raise BulkfetchError(dead)
        finally:
            lister.stop()
            pool.finish(stop_now=not finished)
            _drain(pool)

    def _bodies(self, names: str, sizes: bytes, data: bytes,
                ) -> Iterator[tuple[str, bytes]]:
        lengths = array("Q")
        lengths.frombytes(sizes)
        self.files += len(lengths)
        self.bytes += len(data)
        start = 0
        for name, size in zip(names.split("\0"), lengths, strict=True):
            end = start + size
            yield name, data[start:end]
            start = end

    def _failed(self, failure: Any) -> Iterator[tuple[str, FetchError]]:
        self.failed += 1
        error = FetchError(failure.url or failure.name, failure.reason, failure.attempts)
        if self.errors == "raise":
            raise error
        yield failure.name, error


def _dispatch(lister: Any, pool: Any, pages_out: int, ahead: int) -> tuple[int, bool]:
    """Send listed pages while fewer than `ahead` are out; with none out, wait a little for
    the next. Returns (pages out, whether the listing is over)."""
    from bulkfetch.listing.lister import ListingFailed, ListingFinished
    from bulkfetch.sources.listed import listed_metadata

    wait = 0.05 if pages_out == 0 else 0.0
    while pages_out < ahead:
        try:
            event = lister.out.get(timeout=wait) if wait else lister.out.get_nowait()
        except queue.Empty:
            return pages_out, False
        wait = 0.0
        if isinstance(event, ListingFinished):
            return pages_out, True
        if isinstance(event, ListingFailed):
            raise (UsageError if event.usage else BulkfetchError)(event.message)
        page = event.page
        items = page.items
        if len(set(items)) != len(items):  # a name listed twice is fetched once
            items = tuple(dict.fromkeys(items))
        if items:
            pool.send(Page(event.seq, event.token, items, *listed_metadata(page, items)))
            pages_out += 1
    return pages_out, False


def _drain(pool: Any) -> None:
    """Read what the workers still say (a worker blocked writing to a full pipe could not
    exit) until each has exited, then join them."""
    exited = 0
    deadline = time.monotonic() + DRAIN_S
    while exited < pool.size and time.monotonic() < deadline:
        messages = pool.receive(0.1)
        if not messages and pool.all_gone():
            break
        exited += sum(1 for message in messages if message[0] == "exit")
    pool.join()
    pool.close()
