"""A run: the coordinator in this process, its workers beside it or on a Ray cluster.

run() makes DEST ready (journal, temporaries, tar shards), starts the coordinator
(runners/coordinator.py) with a pool of workers - a ProcessPool (runners/pool.py) of forked
processes, or with runner "ray" a RayPool (runners/ray_pool.py) of actors - and tidies the
shards after. Pages go down to whichever worker is free; page reports and ticks come back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from bulkfetch.config import GetOptions
from bulkfetch.dest import host_memory, index
from bulkfetch.dest.journal import Journal
from bulkfetch.dest.sums import SUMS_DIR, compact
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.models import Report
from bulkfetch.runners.coordinator import Coordinator, ProgressCallback
from bulkfetch.runners.dest import DestBefore, prepare_dest, prepare_shards
from bulkfetch.runners.live import LiveStatus
from bulkfetch.runners.pool import ProcessPool, WorkerPool
from bulkfetch.runners.sync import SyncIndex, listing_filter
from bulkfetch.sinks.directory import TMP_DIR
from bulkfetch.sinks.spool import PARTIAL_DIR
from bulkfetch.sources import make_source


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


def _after_sync(options: GetOptions, sync: SyncIndex, report: Report) -> Report:
    """--sync: the files the listing showed unchanged in the report; after a pass listed
    to its end, with --delete the files the source no longer lists removed, and the sums
    rewritten to what DEST now holds."""
    report = dataclasses.replace(report, unchanged=report.unchanged + sync.unchanged,
                                 unchanged_listed=sync.unchanged,
                                 changed_in_dest=sync.changed_here)
    if not report.listing_complete or report.error is not None or report.interrupted:
        return report  # a file not listed yet is not a file gone
    try:
        if options.sync.delete:
            report = dataclasses.replace(report, deleted=sync.delete_gone(
                limit=options.sync.max_delete))
        sync.compact_sums()
    except BulkfetchError as exc:  # (a UsageError: what only the user can settle, exit 2)
        return dataclasses.replace(report, error=str(exc),
                                   usage_error=isinstance(exc, UsageError))
    return report


def _after_restart(dest: Path, report: Report) -> Report:
    """--restart into a directory, listed to its end: every file stored again has a newer
    sums line, so the sums are rewritten to one line per file (dest/sums.py), for md5sum -c."""
    if not report.listing_complete or report.error is not None or report.interrupted:
        return report
    try:
        compact(dest)
    except (OSError, sqlite3.Error) as exc:
        return dataclasses.replace(report, error=f"cannot rewrite the checksums in "
                                                 f"{dest / SUMS_DIR}: {exc}")
    return report


def run(options: GetOptions, on_progress: ProgressCallback | None = None) -> Report:
    """Download everything the source lists into options.dest. Resumes from the journal.

    Raises UsageError (exit 2) for what the user must change; anything else that stops the
    run (no space for the journal, an I/O error) comes back as Report.error."""
    dest = Path(options.dest)
    prepare_dest(dest)
    before = DestBefore.note(dest)
    source = make_source(options)
    if options.limits.adaptive and not options.restart:
        remembered = host_memory.recall(dest)
        if remembered:  # a former run's hosts: start near what it learned of them
            options = dataclasses.replace(options, limits=dataclasses.replace(
                options.limits, remembered=remembered))
    pool: WorkerPool
    try:
        if options.runner.kind == "ray":
            from bulkfetch.runners.ray_pool import RayPool

            dest.mkdir(parents=True, exist_ok=True)
            ray_pool = RayPool(options)  # connects, checks every node sees DEST, sizes itself
            pool, options = ray_pool, ray_pool.options
        else:
            pool = ProcessPool(options)
        try:
            report = _run(options, source, pool, on_progress)
        finally:
            pool.close()
    except UsageError:
        before.restore()
        raise
    if report.usage_error and not (report.pages or report.files_ok or report.files_failed):
        before.restore()
    return _with_partials(dest, report)


def _with_partials(dest: Path, report: Report) -> Report:
    """The big files fetched in part that DEST keeps for the rerun, counted into `report`."""
    if report.exit_code == 0 or not (dest / PARTIAL_DIR).is_dir():
        return report
    from bulkfetch.engine.resume import records

    kept = [record.written for record in records(dest)]
    return dataclasses.replace(report, partial_files=len(kept), partial_bytes=sum(kept))


def _run(options: GetOptions, source: Any, pool: WorkerPool,
         on_progress: ProgressCallback | None) -> Report:
    dest = Path(options.dest)
    try:
        journal = Journal.open(dest, options.fingerprint(),
                               restart=options.restart or options.plan is not None)
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
                prepare_shards(dest, journal, options.restart,
                               across_hosts=options.runner.kind == "ray")
            except UsageError:
                raise
            except BulkfetchError as exc:
                return _error_report(options, source, str(exc), journal)
        metrics = None
        if options.metrics is not None:
            from bulkfetch.runners.metrics import MetricsServer

            metrics = MetricsServer(options.metrics)
        sync = None
        if options.sync.sync:
            try:
                # --sync --restart: the journal was another run's (another URL, other
                # options); this pass starts from the first page, DEST's MD5s still count
                new_pass = options.restart or journal.start_new_pass()
                sync = SyncIndex(dest, options.sink.fanout, new_pass,
                                 taken=listing_filter(options),
                                 checksum=options.sync.checksum)
            except BulkfetchError as exc:
                return _error_report(options, source, str(exc), journal)
            if options.sync.delete and not sync.covers(journal.pass_key()):
                sync.close()
                raise UsageError(
                    f"--delete: {dest} holds a download that a plain `bulkfetch get` began "
                    "and did not finish, so this pass cannot tell which of its files the "
                    "source no longer lists. Finish it first (the same command without "
                    "--sync, --delete), then run --sync --delete")
        live = LiveStatus(options, source.describe(), metrics)
        coordinator = Coordinator(options, source, journal, on_progress, live, sync)
        try:
            report = coordinator.run(pool)
        finally:
            live.close()
            if options.limits.adaptive:  # for the next run into DEST, stopped or not
                host_memory.remember(dest, (learned for tick in coordinator.ticks.values()
                                            for learned in tick.learned))
        if sync is not None:
            try:
                report = _after_sync(options, sync, report)
            finally:
                sync.close()
        elif options.restart and options.sink.kind == "dir":
            report = _after_restart(dest, report)
        if options.sink.kind == "tar":  # shards whose every file was stored again since
            with contextlib.suppress(OSError, sqlite3.Error):
                index.drop_superseded(dest)
        return report
    finally:
        journal.close()
