"""The local runner: the coordinator in the main process and W worker processes.

Main process: the lister thread, the journal (its only writer), the display and signals.
Pages go down a queue to whichever worker is free; page reports and ticks come back.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bulkfetch import index
from bulkfetch.config import GetOptions
from bulkfetch.engine.channel import channel
from bulkfetch.engine.lister import Listed, Lister, ListingFailed, ListingFinished
from bulkfetch.engine.range_lister import RangeLister
from bulkfetch.engine.worker import worker_main
from bulkfetch.errors import BulkfetchError, JournalIOError, UsageError
from bulkfetch.failures_file import write_failures
from bulkfetch.journal import Journal, Totals
from bulkfetch.live import LiveStatus
from bulkfetch.models import (
    Page,
    PageReport,
    Progress,
    Report,
    Tick,
    largest_first,
)
from bulkfetch.runners.signals import Interrupt, say
from bulkfetch.samples import split_key
from bulkfetch.sinks.directory import TMP_DIR
from bulkfetch.sinks.spool import PARTIAL_DIR
from bulkfetch.sources import make_source
from bulkfetch.sources.base import unusable_name

ProgressCallback = Callable[[Progress], None]
UPDATE_S = 0.1


def _prepare_dest(dest: Path) -> None:
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"DEST {str(dest)!r} exists and is not a directory")


def _prepare_shards(dest: Path, journal: Journal, restart: bool) -> None:
    """Shards and index agree with each other and with the journal before workers start.
    --restart keeps the earlier shards readable until their files are stored again (a failed
    re-fetch never costs the older good copy); only an unusable index is removed."""
    try:
        if restart:
            try:
                index.forget_pages(dest)
            except sqlite3.Error:
                index.remove_all(dest)
        index.connect(dest, create=True).close()  # created, or migrated to this schema
        for report in index.recover(dest, journal.page_is_done):
            journal.page_done(report)
        _journal_stored_retries(dest, journal)
        index.drop_superseded(dest)
    except (OSError, sqlite3.Error) as exc:
        raise BulkfetchError(f"cannot prepare the shards in {dest}: {exc}") from None


def _journal_stored_retries(dest: Path, journal: Journal,
                            failures: Iterable[tuple[int, str]] | None = None) -> None:
    """A --retry-failed page's report is not replayed by recover() (the page is done
    already): the names that pass stored, found in the index, leave the journal's failures
    here, or a later --retry-failed would store them a second time. `failures`: the (seq,
    name) to look at; every journaled failure when not given."""
    stored = index.stored_after_failing(
        dest, journal.failed_names() if failures is None else failures)
    if stored:
        journal.retry_succeeded(stored, sizes=stored)


def _remove_temporaries(dest: Path, sink_kind: str) -> None:
    """What killed workers left: files in DEST/.bulkfetch/tmp; for tar, .tar.part shards
    (finished by renaming when indexed, else deleted, as the next start would)."""
    tmp = dest / TMP_DIR
    shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):
        tmp.mkdir(parents=True, exist_ok=True)
    if sink_kind == "tar":
        with contextlib.suppress(OSError, sqlite3.Error):
            index.recover(dest, lambda seq: True)


def _error_report(options: GetOptions, source: Any, message: str,
                  journal: Journal | None = None) -> Report:
    """The report of a run that stopped before it could start (no journal, no space ...)."""
    totals = None
    if journal is not None:
        with contextlib.suppress(BulkfetchError):
            totals = journal.totals()
    now = time.time()
    return Report(
        source=source.describe(), dest=options.dest, error=message,
        files_ok=totals.files_ok if totals else 0,
        files_failed=totals.files_failed if totals else 0,
        bytes=totals.bytes if totals else 0, pages=totals.pages_done if totals else 0,
        listing_complete=False, resumed_files=totals.files_ok if totals else 0,
        resumed_bytes=totals.bytes if totals else 0, options=options.as_dict(),
        started_at=now, finished_at=now)


def run(options: GetOptions, on_progress: ProgressCallback | None = None) -> Report:
    """Download everything the source lists into options.dest. Resumes from the journal.

    Raises UsageError (exit 2) for what the user must change; anything else that stops the
    run (no space for the journal, an I/O error) comes back as Report.error."""
    dest = Path(options.dest)
    _prepare_dest(dest)
    source = make_source(options)
    try:
        journal = Journal.open(dest, options.fingerprint(),
                               restart=options.restart or options.blobs is not None)
    except UsageError:
        raise
    except BulkfetchError as exc:
        return _error_report(options, source, str(exc))
    try:
        tmp = dest / TMP_DIR
        try:
            shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a killed run
            tmp.mkdir(parents=True, exist_ok=True)
            if options.restart:  # partial big files are kept for a rerun, not a restart
                shutil.rmtree(dest / PARTIAL_DIR, ignore_errors=True)
        except OSError as exc:
            return _error_report(options, source, f"cannot prepare {tmp}: {exc.strerror}",
                                 journal)
        if options.sink.kind == "tar":
            try:
                _prepare_shards(dest, journal, options.restart)
            except UsageError:
                raise
            except BulkfetchError as exc:
                return _error_report(options, source, str(exc), journal)
        metrics = None
        if options.metrics is not None:
            from bulkfetch.metrics import MetricsServer

            metrics = MetricsServer(options.metrics)
        live = LiveStatus(options, source.describe(), metrics)
        try:
            report = _Coordinator(options, source, journal, on_progress, live).run()
        finally:
            live.close()
        if options.sink.kind == "tar":  # shards whose every file was stored again since
            with contextlib.suppress(OSError, sqlite3.Error):
                index.drop_superseded(dest)
        return report
    finally:
        journal.close()


class _Coordinator:
    def __init__(self, options: GetOptions, source: Any, journal: Journal,
                 on_progress: ProgressCallback | None, live: LiveStatus | None = None) -> None:
        self.options = options
        self.source = source
        self.journal = journal
        self.on_progress = on_progress
        # status.json (and --metrics): the run's numbers for whoever looks from outside
        self.live = live or LiveStatus(options, source.describe())
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
        self.workers: list[Any] = []
        self.journaled = [0, 0, 0]  # ok, failed, bytes of the pages this run journaled done
        # The journal cannot be written (disk full, I/O error): stop, as for a sink's fatal
        self.journal_broken = False
        self.usage_error = False  # the run stopped on what only the user can fix (exit 2)

    # -- progress ------------------------------------------------------------------------
    def progress(self, started: float) -> Progress:
        ticks = self.ticks.values()
        return Progress(
            files_ok=self.resumed_ok + sum(t.files_ok for t in ticks),
            files_failed=self.journal_failed_before + sum(t.files_failed for t in ticks),
            bytes=self.resumed_bytes + sum(t.bytes for t in ticks),
            retries=sum(t.retries for t in ticks),
            in_flight=sum(t.in_flight for t in ticks),
            partial_bytes=sum(t.partial_bytes for t in ticks),
            largest=tuple(sorted((entry for t in ticks for entry in t.largest),
                                 key=largest_first)[:self.options.shown_in_flight]),
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
        tasks, stop = context.Queue(), context.Event()
        results, outbox = channel(context)
        workers = [
            context.Process(target=worker_main, name=f"bulkfetch-worker-{i}", daemon=True,
                            args=(i, options, tasks, outbox, stop, os.getpid()))
            for i in range(options.limits.workers)
        ]
        self.workers = workers
        for worker in workers:
            worker.start()
        metrics = self.live.metrics
        if metrics is not None:  # after the fork: no worker holds its socket or thread
            metrics.start()
            say(f"bulkfetch: metrics at {metrics.url}\n")
        key_of = self._key_of if options.sink.kind == "tar" else None
        lister: Lister | RangeLister
        if hasattr(self.source, "list_range"):  # key ranges listed at once (S3)
            lister = RangeLister(self.source, options.retry, replay,
                                 journal.page_tokens() if list_more else [], next_seq,
                                 list_more, ahead=options.limits.max_pages_out,
                                 concurrency=options.s3.list_concurrency, key_of=key_of)
        else:
            lister = Lister(self.source, options.retry, replay, next_seq, next_token,
                            list_more=list_more, ahead=options.limits.max_pages_out,
                            before=journal.last_page() if list_more else None, key_of=key_of)
        started = time.monotonic()
        self.started_at = time.time()
        interrupted = False
        with Interrupt(self._abort) as interrupt:
            lister.start()
            last_update = 0.0
            while True:
                if interrupt.requested:
                    interrupted = True
                    break
                try:
                    # With no page out, the next thing that matters is a listed page (at the
                    # start, or when listing falls behind): wait on the lister, not on the
                    # workers, or each such page would sit up to one collect timeout.
                    starving = not self.listing_over and self.pages_out == 0
                    if not self.listing_over:
                        self._dispatch(lister, tasks, wait=0.05 if starving else 0.0)
                    self._collect(results, timeout=0.0 if starving else 0.05)
                except JournalIOError as exc:
                    self._journal_failed(exc)
                dead = [w for w in workers if not w.is_alive()]
                if dead and self.error is None:
                    self.error = f"worker process {dead[0].name} died (exit code " \
                                 f"{dead[0].exitcode}); rerun the same command to resume"
                if (self.error is None and not self.listing_over and not lister.is_alive()
                        and lister.out.empty()):
                    # it ended without a last word (an exception in the thread)
                    self._fail_run("the listing stopped unexpectedly; rerun the same "
                                   "command to resume")
                if self.error is not None and not self.listing_over:
                    lister.stop()
                    self.listing_over = True
                if self.listing_over and self.pages_out == 0:
                    break
                if self.error is not None and (dead or self.journal_broken):
                    break
                now = time.monotonic()
                if now - last_update >= UPDATE_S:
                    progress = self.progress(started)
                    if self.on_progress is not None:
                        self.on_progress(progress)
                    self.live.update(progress, self.ticks.values())
                    last_update = now
            lister.stop()
            if interrupted or self.error is not None:
                stop.set()
            for _ in workers:
                tasks.put(None)
            self._drain(results, workers)
            if self.options.sink.kind == "tar":
                self._settle_shards()
            progress = self.progress(started)
            if self.on_progress is not None:
                self.on_progress(progress)
            report = self._report(started, interrupted)
            self.live.finish(report, progress, self.ticks.values())
            return report

    def _abort(self) -> None:
        """The second Ctrl-C or SIGTERM: quit now. The workers ignore both signals and a tar
        worker would go on finishing its pages for seconds, so they are killed, and what they
        had half-written is removed. The journal is consistent at every commit; a rerun
        resumes. Runs in the signal handler; the caller then exits with 130."""
        for worker in self.workers:
            with contextlib.suppress(Exception):
                worker.kill()
        for worker in self.workers:
            with contextlib.suppress(Exception):
                worker.join(2)
        _remove_temporaries(Path(self.options.dest), self.options.sink.kind)
        say("bulkfetch: stopped at once (transfers in flight dropped). Rerun the same "
             "command to resume.\n")

    def _settle_shards(self) -> None:
        """With every worker gone: journal the pages of shards that were indexed but whose
        reports never came up (a worker stopping on a fatal error closes its shards without
        sending them), and finish or remove any .tar.part - what the next start would do."""
        try:
            for report in index.recover(Path(self.options.dest), self.journal.page_is_done):
                self._page_done(report)
            if self.retrying:  # retry pages whose reports never came: only their names
                _journal_stored_retries(Path(self.options.dest), self.journal, (
                    (seq, self._name_of(item))
                    for seq, items in self.retrying.items() for item in items))
        except (OSError, sqlite3.Error):
            pass  # the next start recovers them
        except JournalIOError as exc:
            self._journal_failed(exc)

    def _journal_failed(self, exc: JournalIOError) -> None:
        """The journal cannot be written: stop the run with that as its error. What is not
        journaled is fetched again by the rerun."""
        self.journal_broken = True
        if self.error is None:
            self.error = str(exc)
        self.listing_over = True

    def _dispatch(self, lister: Lister, tasks: Any, wait: float = 0.0) -> None:
        """Send listed pages while fewer than the limit are out; `wait` seconds at most for
        the first one."""
        while self.pages_out < self.options.limits.max_pages_out:
            try:
                event = lister.out.get(timeout=wait) if wait else lister.out.get_nowait()
            except queue.Empty:
                return
            wait = 0.0
            if isinstance(event, ListingFinished):
                self.journal.finish_listing()
                self.listing_done = self.listing_over = True
                self.total_files = self.journal.totals().files_listed
                return
            if isinstance(event, ListingFailed):
                self.usage_error = self.usage_error or event.usage
                self._fail_run(event.message)
                return
            assert isinstance(event, Listed)
            page = event.page
            # A name listed twice on one page is fetched and counted once: a second copy
            # would be a second tar member or a pointless overwrite.
            items = page.items
            if len(set(items)) != len(items):
                items = tuple(dict.fromkeys(items))
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

    def _key_of(self, item: str) -> str:
        """The sample an item belongs to (webdataset's key of its name)."""
        return split_key(self._name_of(item))[0]

    def _name_of(self, item: str) -> str:
        """The name a listed item is journaled under (the item itself if unusable)."""
        try:
            return self.source.resolve(item)[0]
        except ValueError:
            return unusable_name(item)

    def _fail_run(self, message: str) -> None:
        self.error = message
        self.listing_over = True
        self._record_error(message)

    def _record_error(self, message: str) -> None:
        try:
            self.journal.record_error(message)
        except JournalIOError:  # the run stops on `message` (often the same cause) anyway
            self.journal_broken = True

    def _page_done(self, report: PageReport) -> None:
        self.journal.page_done(report)
        if report.failures:
            self.live.failed(report.failures)
        if report.seq not in self.retrying:
            self.journaled[0] += report.ok
            self.journaled[1] += len(report.failures)
            self.journaled[2] += report.bytes
        sent = self.retrying.pop(report.seq, None)
        if sent is not None:
            still_failing = {failure.name for failure in report.failures}
            self.journal.retry_succeeded(
                name for name in map(self._name_of, sent) if name not in still_failing)
            return
        self.pages_done += 1

    def _handle(self, message: tuple[Any, ...]) -> int | None:
        kind, value = message[0], message[1]
        if kind == "pages":
            self.pages_out -= value
            for report in message[2]:
                self._page_done(report)
        elif kind == "tick":
            self.ticks[value.worker] = value
        elif kind == "fatal":  # ("fatal", message[, usage]): a worker cannot go on
            if self.error is None:
                self.error = value
                # usage: only the user can fix it (a refused certificate): exit status 2
                self.usage_error = self.usage_error or (len(message) > 2 and bool(message[2]))
                self._record_error(value)
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
            try:
                finished = self._handle(message)
            except JournalIOError as exc:  # this page is fetched again by the rerun
                self._journal_failed(exc)
                continue
            if finished is not None:
                exited.add(finished)
        for worker in workers:
            worker.join(5)
            if worker.is_alive():
                worker.kill()
                worker.join(5)

    def _report(self, started: float, interrupted: bool) -> Report:
        try:
            totals = self.journal.totals()
            failures = self.journal.failures(1000)
        except BulkfetchError as exc:  # the journal cannot be read: what it holds for sure
            if self.error is None:
                self.error = str(exc)
            ok, failed, nbytes = self.journaled
            totals = Totals(self.pages_listed, self.pages_done, self.total_files or 0,
                            self.resumed_ok + ok, self.journal_failed_before + failed,
                            self.resumed_bytes + nbytes, self.listing_done)
            failures = []
        ticks = self.ticks.values()
        failures_file = None
        try:
            written = write_failures(self.journal, Path(self.options.dest))
            failures_file = None if written is None else str(written)
        except Exception as exc:  # a by-product: the run's outcome and report stand without it
            say(f"bulkfetch: cannot write the list of failures ({exc}); the journal "
                 "still holds every failure\n")
        return Report(
            source=self.source.describe(),
            dest=self.options.dest,
            files_ok=totals.files_ok,
            files_failed=totals.files_failed,
            bytes=totals.bytes,
            retries=sum(t.retries for t in ticks),
            ranged_restarts=sum(t.ranged_restarts for t in ticks),
            ranged_size_only=sum(t.size_only for t in ticks),
            concurrency_final=sum(t.limit for t in ticks),
            concurrency_peak=sum(t.peak_limit for t in ticks),
            checked_md5=sum(t.checked[0] for t in ticks),
            checked_digest=sum(t.checked[1] for t in ticks),
            checked_size=sum(t.checked[2] for t in ticks),
            pages=totals.pages_done,
            duration_s=time.monotonic() - started,
            listing_complete=totals.listing_done,
            interrupted=interrupted,
            error=self.error,
            usage_error=self.usage_error,
            resumed_files=self.resumed_ok,
            resumed_bytes=self.resumed_bytes,
            options=self.options.as_dict(),
            failures=failures,
            failures_file=failures_file,
            started_at=self.started_at,
            finished_at=time.time(),
        )
