"""The shard index of a tar destination: DEST/index.sqlite.

One row per closed shard and one row per member (name -> shard, data offset, size, MD5).
Workers add a shard's rows in one transaction when the shard closes; nothing else writes it
during a run. Readers (`ls`, `cat`, `extract`, open_dataset) use it for random access.

Members are inserted in shard-close order and, within a shard, in offset order, so
`ORDER BY rowid` reads the shards sequentially. A name is in the index once: a later copy
(a server listing one name twice) replaces the earlier row, as tar extraction would.

Each shard row counts its `live` members: a row replaced by a later copy of its name fires a
trigger that decrements its shard's count, so drop_superseded() finds the shards nothing
points into by reading the shards table alone, never scanning the members (which, without
an index on `shard`, took 4 s for 2,000,000 members in 20 shards, and grows with members
times shards).

Crash safety (see sinks/tar.py): a shard is written as .tar.part and fsynced, its rows are
committed here, and only then is it renamed to .tar. `recover()` finishes or undoes whatever
a killed run left between those steps, and gives back the page reports each indexed shard
carries, so the journal can mark those pages done even if the run died before it could.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from bulkfetch.models import Failure, PageReport

INDEX_NAME = "index.sqlite"
SHARD_GLOB = "shard-*.tar*"
SHARD_RE = re.compile(r"shard-(\d{3,})-(\d{6,})\.tar(\.part)?\Z")
APPLICATION_ID = 0x62664931  # "bfI1"
SCHEMA_VERSION = 3  # 2: shards.live and the members_superseded trigger; 3: fenced workers
BUSY_TIMEOUT_S = 120.0  # another worker may be committing a 100,000-row shard

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS shards (
    id INTEGER PRIMARY KEY,
    file TEXT NOT NULL UNIQUE,         -- e.g. shard-000-000001.tar, relative to DEST
    worker INTEGER NOT NULL,
    files INTEGER NOT NULL,
    bytes INTEGER NOT NULL,            -- sum of member sizes
    size INTEGER NOT NULL,             -- size of the .tar file
    closed_at REAL NOT NULL,
    pages TEXT NOT NULL,               -- JSON page reports whose files all sit in this shard
    live INTEGER NOT NULL DEFAULT 0    -- member rows still pointing into it
)""",
    """CREATE TABLE IF NOT EXISTS members (
    name TEXT NOT NULL,
    shard INTEGER NOT NULL REFERENCES shards(id),
    offset INTEGER NOT NULL,           -- of the member's data (after its header) in the shard
    size INTEGER NOT NULL,
    md5 TEXT NOT NULL                  -- hex
)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS members_by_name ON members(name)",
    # Workers given up for lost in this run (a Ray actor silent past its lease, whose pages
    # went to others): a shard one of them closes later is refused (_FENCE), never indexed.
    "CREATE TABLE IF NOT EXISTS fenced (worker INTEGER PRIMARY KEY)",
)
FENCED = "fenced: this worker was given up for lost and its pages went to other workers"
_FENCE = f"""CREATE TRIGGER IF NOT EXISTS shards_of_the_fenced BEFORE INSERT ON shards
WHEN EXISTS (SELECT 1 FROM fenced WHERE worker = NEW.worker)
BEGIN SELECT RAISE(ABORT, '{FENCED}'); END"""
# INSERT OR REPLACE deletes the row a later copy of a name replaces; with recursive_triggers
# on (connect() sets it) that deletion fires this. Rows are never deleted otherwise.
_TRIGGER = """CREATE TRIGGER IF NOT EXISTS members_superseded AFTER DELETE ON members
BEGIN UPDATE shards SET live = live - 1 WHERE id = old.shard; END"""
# Version 1 had no live counts: one grouped scan gives them, through a keyed temporary table
# (UPDATE ... FROM would need SQLite 3.33; a subquery per shard would scan the members).
_MIGRATE_FROM_1 = (
    "ALTER TABLE shards ADD COLUMN live INTEGER NOT NULL DEFAULT 0",
    "CREATE TEMP TABLE live_counts (shard INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
    "INSERT INTO live_counts SELECT shard, count(*) FROM members GROUP BY shard",
    "UPDATE shards SET live = coalesce((SELECT n FROM live_counts "
    "WHERE live_counts.shard = shards.id), 0)",
    "DROP TABLE live_counts",
)


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, taken at once (BEGIN IMMEDIATE): committed when the block ends,
    rolled back when it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def shard_file(worker: int, number: int) -> str:
    return f"shard-{worker:03d}-{number:06d}.tar"


def connect(dest: Path, *, create: bool = False, threads: bool = False,
            across_hosts: bool = False) -> sqlite3.Connection:
    """A connection to DEST/index.sqlite (with `create`: created with its schema, or brought
    from an older schema to this one); with `threads`, usable from a thread other than the
    one that opened it (one at a time).

    `across_hosts` (with `create`, while no one else has it open): writers on several
    machines will share it (Ray actors on a shared filesystem). WAL needs every writer on one
    host (its index is shared memory); a rollback journal needs only the filesystem's locks.
    The mode is kept in the file: every later connection uses it."""
    path = Path(dest) / INDEX_NAME
    if not create and not path.is_file():
        raise FileNotFoundError(path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_S,
                           check_same_thread=not threads)
    try:
        conn.execute("PRAGMA recursive_triggers = ON")  # see _TRIGGER
        if create:
            mode = conn.execute(f"PRAGMA journal_mode = {'DELETE' if across_hosts else 'WAL'}"
                                ).fetchone()[0]
            if mode != ("delete" if across_hosts else "wal"):
                raise sqlite3.OperationalError(f"{path} stays in journal mode {mode}: is "
                                               "another process using it?")
            _create_or_migrate(conn, path)
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


def _create_or_migrate(conn: sqlite3.Connection, path: Path) -> None:
    with _immediate(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"{path} has index schema {version}, newer than this bulkfetch knows "
                f"({SCHEMA_VERSION}): upgrade bulkfetch")
        for statement in _SCHEMA:
            conn.execute(statement)
        if version == 1:
            for statement in _MIGRATE_FROM_1:
                conn.execute(statement)
        conn.execute(_TRIGGER)
        conn.execute(_FENCE)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def add_shard(conn: sqlite3.Connection, file: str, worker: int, size: int,
              closed_at: float, pages: Sequence[PageReport],
              members: Sequence[tuple[str, int, int, str]]) -> None:
    """Record a closed shard and its members (name, offset, size, md5) in one transaction."""
    add_shard_flat(conn, file, worker, size, closed_at, pages,
                   [field for member in members for field in member])


_ROWS_PER_INSERT = 100  # multi-row VALUES: half the CPU of one executemany row at a time


def add_shard_flat(conn: sqlite3.Connection, file: str, worker: int, size: int,
                   closed_at: float, pages: Sequence[PageReport],
                   flat: list[str | int]) -> None:
    """add_shard() with the members flattened: [name, offset, size, md5, name, ...], the
    form the tar sink accumulates them in."""
    files = len(flat) // 4
    with _immediate(conn):
        shard_id = conn.execute(
            "INSERT INTO shards (file, worker, files, bytes, size, closed_at, pages, live) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (file, worker, files, sum(flat[2::4]), size, closed_at, _pages_json(pages),
             files),
        ).lastrowid
        # shard_id is an integer SQLite just gave us: safe to write into the statement
        row = f"(?, {int(shard_id)}, ?, ?, ?)"

        def insert(rows: int) -> str:
            return ("INSERT OR REPLACE INTO members (name, shard, offset, size, md5) VALUES "
                    + ", ".join([row] * rows))

        step = 4 * _ROWS_PER_INSERT
        whole = len(flat) // step * step
        if whole:
            conn.executemany(insert(_ROWS_PER_INSERT),
                             (flat[at:at + step] for at in range(0, whole, step)))
        if whole < len(flat):
            conn.execute(insert((len(flat) - whole) // 4), flat[whole:])


def _pages_json(pages: Iterable[PageReport]) -> str:
    return json.dumps([
        [p.seq, p.ok, p.bytes, [[f.name, f.reason, f.attempts] for f in p.failures]]
        for p in pages
    ], ensure_ascii=True)


def _pages_from_json(text: str) -> list[PageReport]:
    return [
        PageReport(seq, ok, size, tuple(Failure(n, r, a) for n, r, a in failures))
        for seq, ok, size, failures in json.loads(text)
    ]


def recover(dest: Path, is_done: Callable[[int], bool],
            worker: int | None = None) -> list[PageReport]:
    """Make DEST's shards agree with the index after a killed run, and return the reports
    of indexed pages that `is_done` (the journal) does not know as done yet. `worker`: only
    that worker's shards (one that died while the others go on writing theirs), and it is
    fenced first: a shard it closes after this (a Ray actor on a node cut off, which wakes)
    is refused by the index, so its pages never count twice.

    - `.tar.part` whose rows were committed: the rename did not happen yet; do it now.
    - `.tar.part` without rows: the shard never closed; its pages are not done; delete it.
    - `.tar` without rows (should not happen): not ours to trust; delete it.

    A worker's reports reach the journal in the order its shards closed, so the scan goes
    from each worker's newest shard back and stops at the first one fully journaled.
    """
    dest = Path(dest)
    indexed: set[str] = set()
    missing: list[PageReport] = []
    if (dest / INDEX_NAME).is_file():
        settled: set[int] = set()
        with contextlib.closing(connect(dest)) as conn:
            if worker is not None:  # first fenced: nothing it closes from now on counts
                with _immediate(conn):
                    conn.execute("INSERT OR IGNORE INTO fenced (worker) VALUES (?)",
                                 (worker,))
            which, args = ("", ()) if worker is None else (" WHERE worker = ?", (worker,))
            indexed = {file for (file,) in conn.execute(f"SELECT file FROM shards{which}",
                                                         args)}
            for writer, pages in conn.execute(
                    f"SELECT worker, pages FROM shards{which} ORDER BY id DESC", args):
                if writer in settled:
                    continue
                reports = _pages_from_json(pages)
                new = [report for report in reports if not is_done(report.seq)]
                missing += new
                if reports and not new:
                    settled.add(writer)
    for entry in os.scandir(dest):
        match = SHARD_RE.match(entry.name)
        if match is None or not entry.is_file(follow_symlinks=False):
            continue
        if worker is not None and int(match.group(1)) != worker:
            continue
        final = entry.name.removesuffix(".part")
        if final in indexed:
            if match.group(3):
                os.rename(entry.path, dest / final)
        else:
            os.unlink(entry.path)
    return sorted(missing, key=lambda report: report.seq)


def clear_fences(dest: Path) -> None:
    """A new run's workers are numbered from 0 again: no fence of an earlier run holds."""
    with contextlib.closing(connect(dest)) as conn, _immediate(conn):
        conn.execute("DELETE FROM fenced")


def stored_after_failing(dest: Path, failures: Iterable[tuple[int, str]]) -> dict[str, int]:
    """Of journaled failures (page seq, name), the names a --retry-failed pass stored whose
    page report never reached the journal (the run was killed in between): the name's row
    points into a shard holding a report of that page. Returns name -> size. Failures come in
    page order, so only the shards last looked at are kept in memory."""
    found: dict[str, int] = {}
    if not (Path(dest) / INDEX_NAME).is_file():
        return found
    pages_of: dict[int, set[int]] = {}
    with contextlib.closing(connect(dest)) as conn:
        for seq, name in failures:
            try:
                row = conn.execute("SELECT shard, size FROM members WHERE name = ?",
                                   (name,)).fetchone()
            except UnicodeEncodeError:  # a name that is not UTF-8 is never stored
                continue
            if row is None:
                continue
            shard, size = row
            if shard not in pages_of:
                if len(pages_of) >= 64:
                    pages_of.clear()
                (pages,) = conn.execute("SELECT pages FROM shards WHERE id = ?",
                                        (shard,)).fetchone()
                pages_of[shard] = {report.seq for report in _pages_from_json(pages)}
            if seq in pages_of[shard]:
                found[name] = size
    return found


def forget_pages(dest: Path) -> None:
    """--restart: the shards of earlier runs stay, readable as before, but their page reports
    no longer count for the new journal (recover() would mark those pages done unfetched).
    Each name is stored again by the new run; its row then points into the new shard, and
    drop_superseded() deletes an old shard once no row points into it. So a re-fetch that
    fails never costs the older good copy. Raises sqlite3.Error if the index is unusable."""
    if not (Path(dest) / INDEX_NAME).is_file():
        return
    with contextlib.closing(connect(dest)) as conn:
        conn.execute("UPDATE shards SET pages = '[]' WHERE pages != '[]'")


def drop_superseded(dest: Path) -> list[str]:
    """Delete the shards no member row points into any more (every name in them was stored
    again in a later shard): rows first, then files; a file left by a kill in between has no
    rows, and recover() deletes it at the next start. Only while no worker writes. Returns
    the shard files deleted."""
    if not (Path(dest) / INDEX_NAME).is_file():
        return []
    with contextlib.closing(connect(dest)) as conn, _immediate(conn):
        files = [file for (file,) in conn.execute(
            "SELECT file FROM shards WHERE live <= 0")]
        conn.execute("DELETE FROM shards WHERE live <= 0")
    for file in files:
        if SHARD_RE.match(file):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(Path(dest) / file)
    return files


def remove_all(dest: Path) -> None:
    """Forget every shard and the index (when the index is unusable for forget_pages())."""
    dest = Path(dest)
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dest / f"{INDEX_NAME}{suffix}")
    if dest.is_dir():
        for entry in os.scandir(dest):
            if SHARD_RE.match(entry.name) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)


def next_shard_number(dest: Path, worker: int) -> int:
    """The first unused shard number of `worker` in DEST."""
    highest = 0
    for entry in os.scandir(dest):
        match = SHARD_RE.match(entry.name)
        if match is not None and int(match.group(1)) == worker:
            highest = max(highest, int(match.group(2)))
    return highest + 1
