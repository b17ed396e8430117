"""What a run does to DEST around its workers: check it, bring tar shards and their index
in line with the journal before workers start, and clean up after workers that were killed.
Shared by every runner whose sinks write DEST on this machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bulkfetch.dest import index
from bulkfetch.dest.journal import STATE_DIR, Journal
from bulkfetch.dest.lock import LOCK_NAME, lock_holder
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.sinks.directory import TMP_DIR


def prepare_dest(dest: Path) -> None:
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"DEST {str(dest)!r} exists and is not a directory")


@dataclass(frozen=True, slots=True)
class DestBefore:
    """What DEST held before a run, so that a run stopped by the user's mistake before it
    listed or stored anything (a wrong URL, a certificate not trusted, a wrong secret) leaves
    DEST as it found it: no journal of a download that never began, no empty DEST."""

    dest: Path
    existed: bool
    had_state: bool  # DEST/.bulkfetch: an earlier run's journal, never removed here
    had_index: bool  # DEST/index.sqlite (the tar sink makes it before workers start)

    @classmethod
    def note(cls, dest: Path) -> DestBefore:
        return cls(dest, dest.exists(), os.path.lexists(dest / STATE_DIR),
                   os.path.lexists(dest / index.INDEX_NAME))

    def restore(self) -> None:
        """Remove what this run made in DEST, and DEST itself when it made it; nothing while
        another run holds DEST's lock (two runs began at once on a new DEST: the other
        one's journal is not this run's to remove)."""
        if self.had_state or lock_holder(self.dest / STATE_DIR / LOCK_NAME)[0]:
            return
        shutil.rmtree(self.dest / STATE_DIR, ignore_errors=True)
        if not self.had_index:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(OSError):
                    os.unlink(self.dest / f"{index.INDEX_NAME}{suffix}")
        if not self.existed:
            with contextlib.suppress(OSError):  # not empty: something else wrote there
                self.dest.rmdir()


def prepare_shards(dest: Path, journal: Journal, restart: bool,
                   across_hosts: bool = False) -> None:
    """Shards and index agree with each other and with the journal before workers start.
    --restart keeps the earlier shards readable until their files are stored again (a failed
    re-fetch never costs the older good copy); only an unusable index is removed.
    `across_hosts`: workers on other machines will write the index (index.connect)."""
    try:
        if restart:
            try:
                index.forget_pages(dest)
            except sqlite3.Error:
                index.remove_all(dest)
        # created, or migrated to this schema
        index.connect(dest, create=True, across_hosts=across_hosts).close()
        index.clear_fences(dest)
        for report in index.recover(dest, journal.page_is_done):
            journal.page_done(report)
        journal_stored_retries(dest, journal)
        index.drop_superseded(dest)
    except (OSError, sqlite3.Error) as exc:
        raise BulkfetchError(f"cannot prepare the shards in {dest}: {exc}") from None


def journal_stored_retries(dest: Path, journal: Journal,
                            failures: Iterable[tuple[int, str]] | None = None) -> None:
    """A --retry-failed page's report is not replayed by recover() (the page is done
    already): the names that pass stored, found in the index, leave the journal's failures
    here, or a later --retry-failed would store them a second time. `failures`: the (seq,
    name) to look at; every journaled failure when not given."""
    stored = index.stored_after_failing(
        dest, journal.failed_names() if failures is None else failures)
    if stored:
        journal.retry_succeeded(stored, sizes=stored)


def remove_temporaries(dest: Path, sink_kind: str) -> None:
    """What killed workers left: files in DEST/.bulkfetch/tmp; for tar, .tar.part shards
    (finished by renaming when indexed, else deleted, as the next start would)."""
    tmp = dest / TMP_DIR
    shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):
        tmp.mkdir(parents=True, exist_ok=True)
    if sink_kind == "tar":
        with contextlib.suppress(OSError, sqlite3.Error):
            index.recover(dest, lambda seq: True)
