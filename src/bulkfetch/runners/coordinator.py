"""The coordinator: one run's lister, journal, display and report, whatever its workers are.

It lists pages (a Lister thread, K ahead), journals each before it goes out, keeps at most
K pages out across the workers, journals the page reports that come back as durable, merges
the workers' ticks into the display's Progress and status.json, and writes the Report. It
never touches a worker directly: a WorkerPool (runners/pool.py) moves pages down and
messages up, so the local runner's processes and a cluster's actors share this code.
"""

from __future__ import annotations

import dataclasses
import queue
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bulkfetch.config import GetOptions
from bulkfetch.dest import index
from bulkfetch.dest.failures_file import write_failures
from bulkfetch.dest.journal import Journal, Totals
from bulkfetch.errors import BulkfetchError, JournalIOError
from bulkfetch.listing.lister import Listed, Lister, ListingFailed, ListingFinished
from bulkfetch.listing.range_lister import RangeLister
from bulkfetch.listing.tree_lister import TreeLister
from bulkfetch.listing.tree_lister import tree_concurrency as _tree_concurrency
from bulkfetch.models import Counts, Page, PageReport, Progress, Report, Tick, largest_first
from bulkfetch.runners.dest import journal_stored_retries, remove_temporaries
from bulkfetch.runners.live import LiveStatus
from bulkfetch.runners.pool import Message, WorkerPool
from bulkfetch.runners.rate_shares import RateShares
from bulkfetch.runners.signals import Interrupt, say
from bulkfetch.runners.sync import SyncIndex
from bulkfetch.sinks.directory import fence
from bulkfetch.sources.base import unusable_name
from bulkfetch.sources.listed import listed_metadata, listed_mtimes
from bulkfetch.util.samples import split_key

ProgressCallback = Callable[[Progress], None]
UPDATE_S = 0.1


class Coordinator:
    def __init__(self, options: GetOptions, source: Any, journal: Journal,
                 on_progress: ProgressCallback | None, live: LiveStatus | None = None,
                 sync: SyncIndex | None = None) -> None:
        self.options = options
        # get --sync: what DEST holds decides what each page asks for (sync.py)
        self.sync = sync
        self.unchanged: dict[int, int] = {}  # seq -> its files the listing showed unchanged
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
        self.sizes_estimated = 0  # files listed this run with a rounded size (Report)
        self.pages_done = before.pages_done
        self.listing_done = before.listing_done
        self.total_files: int | None = before.files_listed if before.listing_done else None
        self.ticks: dict[int, Tick] = {}
        self.pages_out = 0
        self.error: str | None = None
        self.listing_over = False
        self.retry_names: dict[int, set[str]] = {}  # --retry-failed: seq -> failed names
        self.retrying: dict[int, tuple[str, ...]] = {}  # retry pages out: seq -> names sent
        # Earlier failures handed to a worker again: from then on the worker's count has them
        # (as ok or failed), so the journal's count of them no longer does
        self.failures_resent = 0
        self.pool: WorkerPool | None = None
        self.journaled = [0, 0, 0]  # ok, failed, bytes of the pages this run journaled done
        # The journal cannot be written (disk full, I/O error): stop, as for a sink's fatal
        self.journal_broken = False
        self.usage_error = False  # the run stopped on what only the user can fix (exit 2)
        # Pages a lost worker (killed, frozen past --lease) had not made durable: sent again first
        self.requeue: deque[Page] = deque()
        self.pages_reassigned = 0
        self.leases_lapsed = 0  # workers lost for their silence (runners/holdings.py)
        self.lost_workers: dict[int, str] = {}  # worker -> why it was lost
        # --limit-rate and --max-rps over several workers: shares moved to where the bytes
        # and requests are wanted
        self.balancer = RateShares.of_run(options.limits)

    # -- progress ------------------------------------------------------------------------
    def progress(self, started: float) -> Progress:
        ticks = self.ticks.values()
        moved = Counts.total(ticks)
        return Progress(
            files_ok=self.resumed_ok + moved.files_ok,
            files_failed=(self.journal_failed_before - self.failures_resent
                          + moved.files_failed),
            bytes=self.resumed_bytes + moved.bytes,
            retries=moved.retries,
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
            continued_bytes=moved.continued_bytes,
        )

    # -- the run -------------------------------------------------------------------------
    def run(self, pool: WorkerPool) -> Report:
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
        self.pool = pool
        pool.start()
        metrics = self.live.metrics
        if metrics is not None:  # after the fork: no worker holds its socket or thread
            metrics.start()
            say(f"bulkfetch: metrics at {metrics.url}\n")
        key_of = self._key_of if options.sink.kind == "tar" else None
        lister: Lister | RangeLister | TreeLister
        abilities = self.source.abilities()
        ranged, tree = abilities.ranges, abilities.tree
        if tree is not None:  # directories listed at once (a web server's listings)
            lister = TreeLister(tree, options.retry, replay,
                                journal.page_tokens() if list_more else [], next_seq,
                                list_more, ahead=options.limits.max_pages_out,
                                concurrency=_tree_concurrency(options), key_of=key_of)
        elif ranged is not None:  # key ranges listed at once (S3)
            lister = RangeLister(ranged, options.retry, replay,
                                 journal.page_tokens() if list_more else [], next_seq,
                                 list_more, ahead=options.limits.max_pages_out,
                                 concurrency=options.s3.list_concurrency, key_of=key_of)
        else:
            lister = Lister(self.source, options.retry, replay, next_seq, next_token,
                            list_more=list_more, ahead=options.limits.max_pages_out,
                            before=journal.last_page() if list_more else None, key_of=key_of,
                            idle_s=options.timeouts.idle_s)
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
                    if self.requeue and self.error is None:
                        self._send_requeued(pool)
                    if not self.listing_over:
                        self._dispatch(lister, pool, wait=0.05 if starving else 0.0)
                    self._collect(pool, timeout=0.0 if starving else 0.05)
                except JournalIOError as exc:
                    self._journal_failed(exc)
                dead = pool.dead()
                if dead and self.error is None:
                    self.error = f"{dead}; rerun the same command to resume"
                if (self.error is None and not self.listing_over and not lister.is_alive()
                        and lister.out.empty()):
                    # it ended without a last word (an exception in the thread)
                    self._fail_run("the listing stopped unexpectedly; rerun the same "
                                   "command to resume")
                if self.error is not None and not self.listing_over:
                    lister.stop()
                    self.listing_over = True
                if self.listing_over and self.pages_out == 0 and (
                        not self.requeue or self.error is not None):
                    break
                if self.error is not None and (dead or self.journal_broken):
                    break
                now = time.monotonic()
                if self.balancer is not None:
                    shares = self.balancer.look(self.ticks.values(), now, self.lost_workers)
                    if shares is not None:
                        pool.share_rate(shares)
                if now - last_update >= UPDATE_S:
                    progress = self.progress(started)
                    if self.on_progress is not None:
                        self.on_progress(progress)
                    self.live.update(progress, self.ticks.values())
                    last_update = now
            lister.stop()
            pool.finish(stop_now=interrupted or self.error is not None)
            self._drain(pool)
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
        if self.pool is not None:
            self.pool.kill()
        remove_temporaries(Path(self.options.dest), self.options.sink.kind)
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
                journal_stored_retries(Path(self.options.dest), self.journal, (
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

    def _send_requeued(self, pool: WorkerPool) -> None:
        while self.requeue and self.pages_out < self.options.limits.max_pages_out:
            pool.send(self.requeue.popleft())
            self.pages_out += 1

    def _lost(self, worker: int, pages: list[Page], unfetched: int, why: str) -> None:
        """A worker was lost mid-run (its process or node died, or it was silent past
        --lease): what it had made durable stays done; the rest of its pages go to the
        other workers. Its tar shards that were indexed count (their reports may have died
        with it), its .tar.part never will, and its temporary directory is removed."""
        self.lost_workers[worker] = why
        self.pages_out -= unfetched
        tick = self.ticks.get(worker)
        if tick is not None:  # nothing of it is in flight any more
            self.ticks[worker] = dataclasses.replace(tick, in_flight=0, partial_bytes=0,
                                                     largest=())
        dest = Path(self.options.dest)
        held = {page.seq for page in pages}
        recovered: set[int] = set()
        if self.options.sink.kind == "tar":
            try:
                for report in index.recover(dest, self.journal.page_is_done, worker):
                    if report.seq in held:
                        self._page_done(report)
                        recovered.add(report.seq)
            except (OSError, sqlite3.Error) as exc:
                self._fail_run(f"cannot settle the shards of lost worker {worker}: {exc}; "
                               "rerun the same command to resume")
                return
        try:
            fence(dest, worker)  # (a worker that wakes stores no file: sinks/directory.py)
        except OSError as exc:
            self._fail_run(f"cannot fence off lost worker {worker}: {exc}; rerun the same "
                           "command to resume")
            return
        again = [page for page in pages if page.seq not in recovered]
        self.requeue.extend(sorted(again, key=lambda page: page.seq))
        self.pages_reassigned += len(again)
        say(f"bulkfetch: worker {worker} lost ({why}); {len(again)} of its pages go to the "
            "others\n")

    def _dispatch(self, lister: Lister, pool: WorkerPool, wait: float = 0.0) -> None:
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
                self.sizes_estimated += page.estimated
                if event.seq == 0 and self.sync is not None:
                    self.sync.note_pass(self.journal.pass_key())
            if page.total is not None and not self.listing_done:
                self.total_files = page.total
            if event.seq in self.retry_names:
                failed = self.retry_names.pop(event.seq)
                items = tuple(i for i in items if self._name_of(i) in failed)
                self.retrying[event.seq] = items
                if not items:
                    continue
                self.failures_resent += len(items)
            headers = None
            if self.sync is not None and items:
                items, headers = self._sync_plan(event.seq, page, items)
            if not items:
                self._page_done(PageReport(event.seq, 0, 0))
                continue
            pool.send(Page(event.seq, event.token, items,
                           *listed_metadata(page, items), headers=headers))
            self.pages_out += 1

    def _sync_plan(self, seq: int, page: Any, items: tuple[str, ...],
                   ) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
        """--sync: the page's items still to fetch, and their conditional request headers
        (None when none has any: the page then goes as any other)."""
        assert self.sync is not None
        keep, headers = self.sync.plan(items, [self._name_of(item) for item in items],
                                       *listed_metadata(page, items),
                                       mtimes=listed_mtimes(page, items))
        if len(keep) < len(items):  # the listing showed these unchanged: done already
            self.unchanged[seq] = len(items) - len(keep)
            items = tuple(items[at] for at in keep)
        return items, headers if any(headers) else None

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
        unchanged = self.unchanged.pop(report.seq, 0)
        if unchanged:  # (--sync) in step without a request: they count as done
            report = dataclasses.replace(report, ok=report.ok + unchanged)
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

    def _handle(self, message: Message) -> int | None:
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
        elif kind == "lost":  # ("lost", worker, pages, unfetched, why[, lease lapsed])
            self._lost(value, message[2], message[3], message[4])
            self.leases_lapsed += len(message) > 5 and bool(message[5])
        elif kind == "exit":
            return int(value)
        return None

    def _collect(self, pool: WorkerPool, timeout: float) -> None:
        for message in pool.receive(timeout):
            self._handle(message)

    def _drain(self, pool: WorkerPool) -> None:
        """Take every last report the workers send, until each has said it exits."""
        exited: set[int] = set()
        deadline = time.monotonic() + 30
        while len(exited) < pool.size and time.monotonic() < deadline:
            messages = pool.receive(0.2)
            if not messages and pool.all_gone():
                break
            for message in messages:
                try:
                    finished = self._handle(message)
                except JournalIOError as exc:  # this page is fetched again by the rerun
                    self._journal_failed(exc)
                    continue
                if finished is not None:
                    exited.add(finished)
        pool.join()

    def _worker_summaries(self) -> list[dict[str, object]]:
        """What each worker did this run and where it ran (files counted as each stored
        them, so a lost worker's refetched files count twice here, once in the totals)."""
        where = self.pool.where if self.pool is not None else (lambda worker: "")
        return [{"worker": tick.worker, "node": where(tick.worker), "files_ok": tick.files_ok,
                 "files_failed": tick.files_failed, "bytes": tick.bytes,
                 "lost": self.lost_workers.get(tick.worker)}
                for tick in sorted(self.ticks.values(), key=lambda tick: tick.worker)]

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
        moved = Counts.total(ticks)
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
            retries=moved.retries,
            ranged_restarts=sum(t.ranged_restarts for t in ticks),
            ranged_size_only=sum(t.size_only for t in ticks),
            concurrency_final=sum(t.limit for t in ticks),
            concurrency_peak=sum(t.peak_limit for t in ticks),
            checked_md5=sum(t.checked[0] for t in ticks),
            checked_digest=sum(t.checked[1] for t in ticks),
            checked_size=sum(t.checked[2] for t in ticks),
            sizes_estimated=self.sizes_estimated,
            pages=totals.pages_done,
            pages_listed=totals.pages_listed,
            duration_s=time.monotonic() - started,
            listing_complete=totals.listing_done,
            interrupted=interrupted,
            error=self.error,
            usage_error=self.usage_error,
            resumed_files=self.resumed_ok,
            resumed_bytes=self.resumed_bytes,
            continued_bytes=moved.continued_bytes,
            options=self.options.as_dict(),
            failures=failures,
            failures_file=failures_file,
            workers=self._worker_summaries(),
            pages_reassigned=self.pages_reassigned,
            leases_lapsed=self.leases_lapsed,
            hedged=sum(t.hedged for t in ticks),
            hedges_won=sum(t.hedges_won for t in ticks),
            redialed=sum(t.redialed for t in ticks),
            requeued=sum(t.requeued for t in ticks),
            unchanged=sum(t.not_modified + t.same_bodies for t in ticks),
            unchanged_same_body=sum(t.same_bodies for t in ticks),
            started_at=self.started_at,
            finished_at=time.time(),
        )
