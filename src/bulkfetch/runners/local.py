"""The local runner: the coordinator in the main process and W worker processes.

Main process: the lister thread, the journal (its only writer), the display and signals.
Pages go down a queue to whichever worker is free; page reports and ticks come back.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bulkfetch import index
from bulkfetch.config import GetOptions
from bulkfetch.engine.lister import Listed, Lister, ListingFailed, ListingFinished
from bulkfetch.engine.worker import worker_main
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.journal import Journal
from bulkfetch.models import Page, PageReport, Progress, Report, Tick
from bulkfetch.sinks.directory import TMP_DIR
from bulkfetch.sources import make_source

ProgressCallback = Callable[[Progress], None]
UPDATE_S = 0.1


class _Interrupt:
    """First SIGINT/SIGTERM: stop gracefully. Second: leave at once (the journal is
    consistent at every commit, so a rerun resumes either way)."""

    def __init__(self) -> None:
        self.requested = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            os._exit(130)
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _prepare_dest(dest: Path) -> None:
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"DEST {str(dest)!r} exists and is not a directory")


def _prepare_shards(dest: Path, journal: Journal, restart: bool) -> None:
    """Shards and index agree with each other and with the journal before workers start."""
    try:
        if restart:
            index.remove_all(dest)
        for report in index.recover(dest, journal.page_is_done):
            journal.page_done(report)
        index.connect(dest, create=True).close()
    except (OSError, sqlite3.Error) as exc:
        raise BulkfetchError(f"cannot prepare the shards in {dest}: {exc}") from None


def run(options: GetOptions, on_progress: ProgressCallback | None = None) -> Report:
    """Download everything the source lists into options.dest. Resumes from the journal."""
    dest = Path(options.dest)
    _prepare_dest(dest)
    source = make_source(options)
    journal = Journal.open(dest, options.fingerprint(), restart=options.restart)
    try:
        tmp = dest / TMP_DIR
        shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a killed run
        tmp.mkdir(parents=True, exist_ok=True)
        if options.sink.kind == "tar":
            _prepare_shards(dest, journal, options.restart)
        return _Coordinator(options, source, journal, on_progress).run()
    finally:
        journal.close()


class _Coordinator:
    def __init__(self, options: GetOptions, source: Any, journal: Journal,
                 on_progress: ProgressCallback | None) -> None:
        self.options = options
        self.source = source
        self.journal = journal
        self.on_progress = on_progress
        before = journal.totals()
        self.resumed_ok = before.files_ok
        self.journal_failed_before = before.files_failed
        self.resumed_bytes = before.bytes
        self.pages_listed = before.pages_listed
        self.pages_done = before.pages_done
        self.listing_done = before.listing_done
        self.total_files: int | None = before.files_listed if before.listing_done else None
        self.ticks: dict[int, Tick] = {}
        self.pages_out = 0
        self.error: str | None = None
        self.listing_over = False
        self.retry_names: dict[int, set[str]] = {}  # --retry-failed: seq -> failed names
        self.retrying: dict[int, tuple[str, ...]] = {}  # retry pages out: seq -> names sent

    # -- progress ------------------------------------------------------------------------
    def progress(self, started: float) -> Progress:
        ticks = self.ticks.values()
        return Progress(
            files_ok=self.resumed_ok + sum(t.files_ok for t in ticks),
            files_failed=self.journal_failed_before + sum(t.files_failed for t in ticks),
            bytes=self.resumed_bytes + sum(t.bytes for t in ticks),
            retries=sum(t.retries for t in ticks),
            in_flight=sum(t.in_flight for t in ticks),
            pages_listed=self.pages_listed,
            pages_done=self.pages_done,
            listing_done=self.listing_done,
            total_files=self.total_files,
            elapsed_s=time.monotonic() - started,
            resumed_files=self.resumed_ok,
            resumed_bytes=self.resumed_bytes,
        )

    # -- the run -------------------------------------------------------------------------
    def run(self) -> Report:
        options, journal = self.options, self.journal
        next_seq, next_token, listing_done = journal.resume_point()
        self.listing_done = listing_done
        replay, list_more = journal.pending_pages(), not listing_done
        if options.retry_failed:
            # Also re-list the done pages with failures and fetch only their failed names.
            # Unfinished pages and listing resume as usual: ending the run after the retries
            # alone would journal an incomplete listing as complete.
            replay = sorted(replay + journal.failed_pages(), key=lambda page: page[0])
            for seq, name in journal.failed_names():
                self.retry_names.setdefault(seq, set()).add(name)
        context = multiprocessing.get_context("fork")
        tasks, results, stop = context.Queue(), context.Queue(), context.Event()
        workers = [
            context.Process(target=worker_main, name=f"bulkfetch-worker-{i}", daemon=True,
                            args=(i, options, tasks, results, stop, os.getpid()))
            for i in range(options.limits.workers)
        ]
        for worker in workers:
            worker.start()
        lister = Lister(self.source, options.retry, replay, next_seq, next_token,
                        list_more=list_more, ahead=options.limits.max_pages_out,
                        before=journal.last_page() if list_more else None)
        started = time.monotonic()
        self.started_at = time.time()
        interrupted = False
        with _Interrupt() as interrupt:
            lister.start()
            last_update = 0.0
            while True:
                if interrupt.requested:
                    interrupted = True
                    break
                if not self.listing_over:
                    self._dispatch(lister, tasks)
                self._collect(results, timeout=0.05)
                dead = [w for w in workers if not w.is_alive()]
                if dead and self.error is None:
                    self.error = f"worker process {dead[0].name} died (exit code " \
                                 f"{dead[0].exitcode}); rerun the same command to resume"
                if self.error is not None and not self.listing_over:
                    lister.stop()
                    self.listing_over = True
                if self.listing_over and self.pages_out == 0:
                    break
                if self.error is not None and dead:
                    break
                now = time.monotonic()
                if self.on_progress is not None and now - last_update >= UPDATE_S:
                    self.on_progress(self.progress(started))
                    last_update = now
            lister.stop()
            if interrupted or self.error is not None:
                stop.set()
            for _ in workers:
                tasks.put(None)
            self._drain(results, workers)
        if self.on_progress is not None:
            self.on_progress(self.progress(started))
        return self._report(started, interrupted)

    def _dispatch(self, lister: Lister, tasks: Any) -> None:
        while self.pages_out < self.options.limits.max_pages_out:
            try:
                event = lister.out.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, ListingFinished):
                self.journal.finish_listing()
                self.listing_done = self.listing_over = True
                self.total_files = self.journal.totals().files_listed
                return
            if isinstance(event, ListingFailed):
                self._fail_run(event.message)
                return
            assert isinstance(event, Listed)
            page = event.page
            # A name listed twice on one page is fetched and counted once: a second copy
            # would be a second tar member or a pointless overwrite.
            items = tuple(dict.fromkeys(page.items))
            if not event.replay:
                try:
                    self.journal.add_page(event.seq, event.token, page.next_token,
                                          len(items))
                except BulkfetchError as exc:  # a token loop
                    self._fail_run(str(exc))
                    return
                self.pages_listed += 1
            if page.total is not None and not self.listing_done:
                self.total_files = page.total
            if event.seq in self.retry_names:
                failed = self.retry_names.pop(event.seq)
                items = tuple(i for i in items if self._name_of(i) in failed)
                self.retrying[event.seq] = items
                if not items:
                    continue
            if not items:
                self._page_done(PageReport(event.seq, 0, 0))
                continue
            tasks.put(Page(event.seq, event.token, items))
            self.pages_out += 1

    def _name_of(self, item: str) -> str:
        """The name a listed item is journaled under (the item itself if unusable)."""
        try:
            return self.source.resolve(item)[0]
        except ValueError:
            return item

    def _fail_run(self, message: str) -> None:
        self.error = message
        self.journal.record_error(message)
        self.listing_over = True

    def _page_done(self, report: PageReport) -> None:
        self.journal.page_done(report)
        sent = self.retrying.pop(report.seq, None)
        if sent is not None:
            still_failing = {failure.name for failure in report.failures}
            self.journal.retry_succeeded(
                name for name in map(self._name_of, sent) if name not in still_failing)
            return
        self.pages_done += 1

    def _handle(self, message: tuple[str, Any]) -> int | None:
        kind, value = message
        if kind == "page":
            self._page_done(value)
        elif kind == "fetched":
            self.pages_out -= value
        elif kind == "tick":
            self.ticks[value.worker] = value
        elif kind == "fatal":
            if self.error is None:
                self.error = value
                self.journal.record_error(value)
        elif kind == "exit":
            return int(value)
        return None

    def _collect(self, results: Any, timeout: float) -> None:
        try:
            message = results.get(timeout=timeout)
        except queue.Empty:
            return
        self._handle(message)
        while True:
            try:
                message = results.get_nowait()
            except queue.Empty:
                return
            self._handle(message)

    def _drain(self, results: Any, workers: list[Any]) -> None:
        """Take every last report the workers send, until each has said it exits."""
        exited: set[int] = set()
        deadline = time.monotonic() + 30
        while len(exited) < len(workers) and time.monotonic() < deadline:
            try:
                message = results.get(timeout=0.2)
            except queue.Empty:
                if not any(w.is_alive() for w in workers):
                    break
                continue
            finished = self._handle(message)
            if finished is not None:
                exited.add(finished)
        for worker in workers:
            worker.join(5)
            if worker.is_alive():
                worker.kill()

    def _report(self, started: float, interrupted: bool) -> Report:
        totals = self.journal.totals()
        ticks = self.ticks.values()
        return Report(
            source=self.source.describe(),
            dest=self.options.dest,
            files_ok=totals.files_ok,
            files_failed=totals.files_failed,
            bytes=totals.bytes,
            retries=sum(t.retries for t in ticks),
            pages=totals.pages_done,
            duration_s=time.monotonic() - started,
            listing_complete=totals.listing_done,
            interrupted=interrupted,
            error=self.error,
            resumed_files=self.resumed_ok,
            resumed_bytes=self.resumed_bytes,
            options=self.options.as_dict(),
            failures=self.journal.failures(1000),
            started_at=self.started_at,
            finished_at=time.time(),
        )
