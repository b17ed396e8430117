"""The run's journal: DEST/.bulkfetch/journal.sqlite (SQLite, WAL, synchronous=NORMAL).

It holds the run's fingerprint (source and output layout), every listed page (seq, token,
next token, count, status, ok/bytes/failed) and one row per failed name. Rerunning the same
command resumes from it; `bulkfetch status DEST` reads it (read_status) while a run holds it.

Threading and processes: a Journal is written from ONE thread of the main process only (the
sqlite3 connection refuses use from any other thread). Workers never touch it: they send
PageReports up and the main process calls page_done(). A Journal holds DEST's lock
(lock.py) from open() to close().

Counting is incremental: SQLite triggers keep the one-row `run` table equal to the sums over
`pages` (and each page's `failed` equal to its rows in `failures`) inside every write
transaction, so totals() is O(1), and a crash at any moment leaves the two consistent.
Memory never grows with the number of files: failed_names() streams in chunks.

Encoding: tokens and names are stored as TEXT, or as a UTF-8 (surrogatepass) BLOB when they
contain NUL or lone surrogates, so hostile names round-trip exactly. The first page's token
(None) is stored as '' - an empty token from the server is therefore the first page's token.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bulkfetch.dest.lock import LOCK_NAME, lock_dest, unlock_dest
from bulkfetch.errors import (
    NOT_WRITABLE_ERRNOS,
    DestNotWritable,
    JournalCorrupt,
    JournalIOError,
    JournalMismatch,
    TokenLoop,
)
from bulkfetch.models import Failure, PageReport
from bulkfetch.util.redact import redact_text, redact_value

SCHEMA_VERSION = 1
APPLICATION_ID = 0x62664A31  # "bfJ1": marks the file as a bulkfetch journal
STATE_DIR = ".bulkfetch"
DB_NAME = "journal.sqlite"
_CHUNK = 1000

State = Literal["running", "finished", "finished with failures", "interrupted", "empty"]

_SCHEMA = """
CREATE TABLE run (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    fingerprint TEXT NOT NULL,
    started_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    listing_done INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    pages_listed INTEGER NOT NULL DEFAULT 0,
    pages_done INTEGER NOT NULL DEFAULT 0,
    files_listed INTEGER NOT NULL DEFAULT 0,
    files_ok INTEGER NOT NULL DEFAULT 0,
    files_failed INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE pages (
    seq INTEGER PRIMARY KEY,
    token NOT NULL UNIQUE,                  -- '' for the first page
    next_token,                             -- NULL on the last page
    count INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'listed' CHECK (status IN ('listed', 'done')),
    ok INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,      -- = its rows in failures (triggers)
    listed_at REAL NOT NULL,
    done_at REAL
);
CREATE INDEX pages_pending ON pages(seq) WHERE status = 'listed';
CREATE TABLE failures (
    name PRIMARY KEY,
    seq INTEGER NOT NULL REFERENCES pages(seq),
    reason TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    at REAL NOT NULL,
    url TEXT                                -- added after schema 1 shipped: may be missing
) WITHOUT ROWID;
CREATE INDEX failures_by_page ON failures(seq, name);

CREATE TRIGGER pages_ins AFTER INSERT ON pages BEGIN
    UPDATE run SET pages_listed = pages_listed + 1, files_listed = files_listed + NEW.count,
        pages_done = pages_done + (NEW.status = 'done'), files_ok = files_ok + NEW.ok,
        files_failed = files_failed + NEW.failed, bytes = bytes + NEW.bytes;
END;
CREATE TRIGGER pages_upd AFTER UPDATE ON pages BEGIN
    UPDATE run SET files_listed = files_listed + NEW.count - OLD.count,
        pages_done = pages_done + (NEW.status = 'done') - (OLD.status = 'done'),
        files_ok = files_ok + NEW.ok - OLD.ok,
        files_failed = files_failed + NEW.failed - OLD.failed,
        bytes = bytes + NEW.bytes - OLD.bytes;
END;
CREATE TRIGGER failures_ins AFTER INSERT ON failures BEGIN
    UPDATE pages SET failed = failed + 1 WHERE seq = NEW.seq;
END;
CREATE TRIGGER failures_del AFTER DELETE ON failures BEGIN
    UPDATE pages SET failed = failed - 1 WHERE seq = OLD.seq;
END;
CREATE TRIGGER failures_move AFTER UPDATE OF seq ON failures WHEN NEW.seq != OLD.seq BEGIN
    UPDATE pages SET failed = failed - 1 WHERE seq = OLD.seq;
    UPDATE pages SET failed = failed + 1 WHERE seq = NEW.seq;
END;
"""

_UPSERT_FAILURE = (
    "INSERT INTO failures (name, seq, reason, attempts, at, url) VALUES (?, ?, ?, ?, ?, ?) "
    # a retry that fails before any transfer (URL unknown) keeps the URL already known
    "ON CONFLICT (name) DO UPDATE SET url = coalesce(excluded.url, failures.url), "
)
_UPSERT_NEW = _UPSERT_FAILURE + (
    "seq = excluded.seq, reason = excluded.reason, attempts = excluded.attempts, at = excluded.at"
)
_UPSERT_RETRY = _UPSERT_FAILURE + (
    "reason = excluded.reason, attempts = failures.attempts + excluded.attempts, at = excluded.at"
)


@dataclass(frozen=True, slots=True)
class Totals:
    pages_listed: int = 0
    pages_done: int = 0
    files_listed: int = 0
    files_ok: int = 0
    files_failed: int = 0  # = rows in failures
    bytes: int = 0
    listing_done: bool = False
    started_at: float = 0.0  # when the journal was created (unix time)
    updated_at: float = 0.0  # its last write


# ---------------------------------------------------------------------------- encoding


def _enc(value: str) -> str | bytes:
    """TEXT when SQLite can hold it as is, else a BLOB (injective: TEXT != BLOB)."""
    if "\x00" not in value:
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            pass
    return value.encode("utf-8", "surrogatepass")


def _name(name: str) -> str | bytes:
    """A file name as journaled: encoded, and masked when it is a whole URL that may carry a
    secret (an unusable --from-file line is reported under the line itself)."""
    return _enc(redact_text(name))


def decode_text(value: str | bytes) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


def _text(value: str) -> str:
    """Free text (reasons, errors) made storable, URL secrets masked; for display only."""
    value = redact_text(value)
    return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _fingerprint_json(fingerprint: dict[str, object]) -> str:
    """Secrets in the source URL never reach the journal (bulkfetch.util.redact)."""
    return json.dumps(redact_value(fingerprint), sort_keys=True, default=str)


_ABSENT = object()


def _differences(old: object, new: object, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        lines: list[str] = []
        for key in sorted(set(old) | set(new)):
            lines += _differences(old.get(key, _ABSENT), new.get(key, _ABSENT), f"{prefix}{key}.")
        return lines
    if old == new:
        return []

    def show(v: object) -> str:
        return "(absent)" if v is _ABSENT else json.dumps(v, sort_keys=True)

    return [f"  {prefix.rstrip('.') or '(fingerprint)'}: {show(old)} vs {show(new)}"]


# ---------------------------------------------------------------------------- schema


def corrupt_journal(path: Path, why: str) -> JournalCorrupt:
    return JournalCorrupt(f"{path} {why}: use --restart to start over (files already "
                          "downloaded are kept), or choose another DEST")


def check_schema(conn: sqlite3.Connection, path: Path) -> bool:
    """True when the file holds our schema, False when it is empty; else JournalCorrupt."""
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise corrupt_journal(path, f"is not a valid bulkfetch journal ({exc})") from None
    if app_id == 0 and version == 0 and tables == 0:
        return False
    if app_id != APPLICATION_ID:
        raise corrupt_journal(path, "is not a bulkfetch journal")
    if version != SCHEMA_VERSION:
        raise corrupt_journal(path, f"was written by another bulkfetch version (journal schema "
                             f"{version}, this version reads {SCHEMA_VERSION})")
    try:
        if conn.execute("SELECT count(*) FROM run").fetchone()[0] != 1:
            raise corrupt_journal(path, "is damaged (no run record)")
    except sqlite3.DatabaseError as exc:
        raise corrupt_journal(path, f"is damaged ({exc})") from None
    return True


def totals_of(row: tuple[Any, ...]) -> Totals:
    listed, done, f_listed, ok, failed, nbytes, listing_done, started, updated = row
    return Totals(listed, done, f_listed, ok, failed, nbytes, bool(listing_done), started, updated)


TOTALS_SQL = ("SELECT pages_listed, pages_done, files_listed, files_ok, files_failed, bytes, "
               "listing_done, started_at, updated_at FROM run")
FAILURES_SQL = "SELECT name, reason, attempts FROM failures ORDER BY seq, name LIMIT ?"


# ---------------------------------------------------------------------------- journal


class Journal:
    """The journal of the run writing into `dest`. Create with Journal.open()."""

    def __init__(self, dest: Path, conn: sqlite3.Connection, lock_fd: int, resumed: bool):
        self.dest = dest
        self.path = dest / STATE_DIR / DB_NAME
        self.resumed = resumed
        self._conn: sqlite3.Connection | None = conn
        self._lock_fd = lock_fd

    @classmethod
    def open(cls, dest: Path, fingerprint: dict[str, object], *,
             restart: bool = False) -> Journal:
        dest = Path(dest)
        state = dest / STATE_DIR
        try:
            dest.mkdir(parents=True, exist_ok=True)
            if state.is_symlink() or (state.exists() and not state.is_dir()):
                raise corrupt_journal(state, "is not a directory bulkfetch made (a symlink or "
                                             "a file)")
            state.mkdir(exist_ok=True)
            lock_fd = lock_dest(dest, state / LOCK_NAME)
        except OSError as exc:
            # (ENOENT from a mkdir that makes its parents: the filesystem allows no
            # directory there, as under /proc)
            if exc.errno in NOT_WRITABLE_ERRNOS or exc.errno == errno.ENOENT:
                where = exc.filename if exc.filename is not None else state
                raise DestNotWritable(
                    f"cannot write to DEST {dest}: {exc.strerror} ({where}): choose a DEST "
                    "on storage you can write to, or fix its permissions") from None
            raise JournalIOError(f"cannot create the journal in {state}: {exc}") from None
        try:
            conn, resumed = cls._connect(dest, state / DB_NAME, fingerprint, restart)
        except BaseException:
            unlock_dest(lock_fd)
            raise
        return cls(dest, conn, lock_fd, resumed)

    @staticmethod
    def _connect(dest: Path, path: Path, fingerprint: dict[str, object],
                 restart: bool) -> tuple[sqlite3.Connection, bool]:
        if restart:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{path}{suffix}")
        fp_json = _fingerprint_json(fingerprint)
        try:
            conn = sqlite3.connect(path, isolation_level=None, timeout=10.0)
        except sqlite3.Error as exc:
            raise JournalIOError(f"cannot open the journal {path}: {exc}") from None
        try:
            exists = check_schema(conn, path)
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA foreign_keys = ON")
                if not exists:
                    # one transaction (executescript takes no parameters: fp_json is pure
                    # ASCII JSON, quoted as an SQL literal)
                    now, literal = repr(time.time()), "'" + fp_json.replace("'", "''") + "'"
                    conn.executescript(
                        f"BEGIN IMMEDIATE; {_SCHEMA}"
                        "INSERT INTO run (id, fingerprint, started_at, updated_at) "
                        f"VALUES (0, {literal}, {now}, {now});"
                        f"PRAGMA user_version = {SCHEMA_VERSION};"
                        f"PRAGMA application_id = {APPLICATION_ID}; COMMIT;")
                    return conn, False
                stored, listed, done = conn.execute(
                    "SELECT fingerprint, pages_listed, listing_done FROM run").fetchone()
                columns = {row[1] for row in conn.execute("PRAGMA table_info(failures)")}
                if "url" not in columns:  # a journal from before failures kept their URL
                    conn.execute("ALTER TABLE failures ADD COLUMN url TEXT")
            except sqlite3.OperationalError as exc:
                raise JournalIOError(f"cannot open the journal {path}: {exc}") from None
            except sqlite3.DatabaseError as exc:
                raise corrupt_journal(path, f"is damaged ({exc})") from None
            try:
                old = json.loads(stored)
            except ValueError:
                raise corrupt_journal(path, "is damaged (unreadable fingerprint)") from None
            new = json.loads(fp_json)
            if old != new:
                diff = tuple(_differences(old, new))
                raise JournalMismatch(
                    f"{dest} holds the journal of a different run (journal vs this run):\n"
                    + "\n".join(diff)
                    + "\nUse --restart to start over (files already downloaded are kept; "
                    "with --sync, only the files that differ are fetched again), or choose "
                    "another DEST.", differences=tuple(d.strip() for d in diff))
            try:  # a new run: the previous run's error no longer describes DEST
                conn.execute("UPDATE run SET last_error = NULL, updated_at = ?", (time.time(),))
            except sqlite3.OperationalError as exc:
                raise JournalIOError(f"cannot write the journal {path}: {exc}") from None
            return conn, bool(listed or done)
        except BaseException:
            conn.close()
            raise

    # -- plumbing

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the journal is closed")
        return self._conn

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:  # disk full, I/O error, read-only ...
            raise JournalIOError(f"cannot use the journal {self.path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:  # misuse (wrong thread ...): a bug
                raise
            raise corrupt_journal(self.path, f"is damaged ({exc})") from None

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction; rolled back on any error."""
        conn = self._db
        with self._translated():
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("UPDATE run SET updated_at = ?", (time.time(),))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        with self._translated():
            return self._db.execute(sql, args).fetchone()

    # -- listing

    def add_page(self, seq: int, token: str | None, next_token: str | None, count: int) -> None:
        """Journal a listed page. Same (seq, token) again updates next_token and count."""
        tok = "" if token is None else _enc(token)
        nxt = None if next_token is None else _enc(next_token)
        with self._write() as c:
            row = c.execute("SELECT seq FROM pages WHERE token = ?", (tok,)).fetchone()
            if row is not None and row[0] != seq:
                raise TokenLoop(f"page {seq}'s token was already listed as page {row[0]}: "
                                "the server's pagination loops", seq=seq, first_seq=row[0])
            if row is not None:
                c.execute("UPDATE pages SET next_token = ?, count = ? WHERE seq = ?",
                          (nxt, count, seq))
            elif c.execute("SELECT 1 FROM pages WHERE seq = ?", (seq,)).fetchone():
                raise ValueError(f"page {seq} is already journaled with another token")
            else:
                c.execute("INSERT INTO pages (seq, token, next_token, count, listed_at) "
                          "VALUES (?, ?, ?, ?, ?)", (seq, tok, nxt, count, time.time()))
            if next_token is None:  # the last page: listing is complete
                c.execute("UPDATE run SET listing_done = 1")

    def start_new_pass(self) -> bool:
        """`get --sync`: when the journaled run is complete (listed to the end, every page
        done), forget its pages and failures so the source is listed again from its first
        page; the files stay. An unfinished run (a sync that was interrupted) is left to
        resume. Returns whether a new pass began."""
        totals = self.totals()
        if not totals.listing_done or totals.pages_done < totals.pages_listed:
            return False
        with self._write() as c:
            c.execute("DELETE FROM failures")
            c.execute("DELETE FROM pages")  # (no trigger on delete: the counts are reset)
            c.execute("UPDATE run SET listing_done = 0, pages_listed = 0, pages_done = 0, "
                      "files_listed = 0, files_ok = 0, files_failed = 0, bytes = 0")
        return True

    def finish_listing(self) -> None:
        with self._write() as c:
            c.execute("UPDATE run SET listing_done = 1")

    def pending_pages(self) -> list[tuple[int, str | None, str | None]]:
        """(seq, token, next token) of the pages not done, in seq order."""
        return self._pages("status = 'listed'")

    def failed_pages(self) -> list[tuple[int, str | None, str | None]]:
        """(seq, token, next token) of done pages that still have failures, in seq order."""
        return self._pages("status = 'done' AND failed > 0")

    def _pages(self, where: str) -> list[tuple[int, str | None, str | None]]:
        with self._translated():
            rows = self._db.execute(
                f"SELECT seq, token, next_token FROM pages WHERE {where} ORDER BY seq"
            ).fetchall()
        return [(seq, None if tok == "" else decode_text(tok),
                 None if nxt is None else decode_text(nxt)) for seq, tok, nxt in rows]

    def page_tokens(self) -> list[tuple[str, str | None]]:
        """(token, next token) of every journaled page: what a key-range listing has
        covered (listing/ranges.py)."""
        with self._translated():
            rows = self._db.execute("SELECT token, next_token FROM pages").fetchall()
        return [(decode_text(tok), None if nxt is None else decode_text(nxt)) for tok, nxt in rows]

    def last_page(self) -> tuple[int, str | None] | None:
        """(seq, token) of the last journaled page; None before the first."""
        row = self._one("SELECT seq, token FROM pages ORDER BY seq DESC LIMIT 1")
        if row is None:
            return None
        seq, tok = row
        return seq, None if tok == "" else decode_text(tok)

    def resume_point(self) -> tuple[int, str | None, bool]:
        (done,) = self._one("SELECT listing_done FROM run")
        row = self._one("SELECT seq, next_token FROM pages ORDER BY seq DESC LIMIT 1")
        if row is None:
            return 0, None, bool(done)
        seq, nxt = row
        return seq + 1, None if nxt is None else decode_text(nxt), bool(done)

    # -- results

    def page_done(self, report: PageReport) -> None:
        """Mark a page done with its counts and failures, in one transaction.

        On a page that is already done (a --retry-failed pass reporting under the page's
        seq): failures are upserted (reason replaced, attempts added, page kept), bytes are
        added, and report.ok is NOT counted - retry_succeeded(names) moves those names.
        """
        now = time.time()
        with self._write() as c:
            row = c.execute("SELECT status FROM pages WHERE seq = ?", (report.seq,)).fetchone()
            if row is None:
                raise ValueError(f"page {report.seq} was never journaled (call add_page first)")
            if row[0] == "listed":
                c.execute("UPDATE pages SET status = 'done', ok = ?, bytes = ?, done_at = ? "
                          "WHERE seq = ?", (report.ok, report.bytes, now, report.seq))
                sql = _UPSERT_NEW
            else:
                c.execute("UPDATE pages SET bytes = bytes + ?, done_at = ? WHERE seq = ?",
                          (report.bytes, now, report.seq))
                sql = _UPSERT_RETRY
            c.executemany(sql, ((_name(f.name), report.seq, _text(f.reason), f.attempts, now,
                                 _text(f.url) or None) for f in report.failures))

    def pass_key(self) -> float | None:
        """What tells this pass over the listing from another: when its first page was
        listed (None before it was). get --sync ties the paths it noted to it (runners/sync.py)."""
        row = self._one("SELECT listed_at FROM pages WHERE seq = 0")
        return None if row is None else float(row[0])

    def page_is_done(self, seq: int) -> bool:
        row = self._one("SELECT status FROM pages WHERE seq = ?", (seq,))
        return row is not None and row[0] == "done"

    def retry_succeeded(self, names: Iterable[str], *,
                        sizes: Mapping[str, int] | None = None) -> None:
        """Names that succeeded on a retry pass: out of failures, counted ok on their page.
        `sizes` adds their bytes to the page too, for stores no page report brings (found in
        the tar index after a kill); a name no longer failed is left alone."""
        sizes = sizes or {}
        with self._write() as c:
            it = iter(names)
            while chunk := [(n, _name(n)) for _, n in zip(range(_CHUNK), it, strict=False)]:
                c.executemany("UPDATE pages SET ok = ok + 1, bytes = bytes + ? WHERE seq = "
                              "(SELECT seq FROM failures WHERE name = ?)",
                              [(sizes.get(n, 0), key) for n, key in chunk])
                c.executemany("DELETE FROM failures WHERE name = ?", [(key,) for _, key in chunk])

    def record_error(self, message: str) -> None:
        with self._write() as c:
            c.execute("UPDATE run SET last_error = ?", (_text(message),))

    # -- reading

    def totals(self) -> Totals:
        return totals_of(self._one(TOTALS_SQL))

    def failures(self, limit: int = 1000) -> list[Failure]:
        with self._translated():
            # not FAILURES_SQL: `status` reads journals older than the url column with it
            rows = self._db.execute("SELECT name, reason, attempts, url FROM failures "
                                    "ORDER BY seq, name LIMIT ?", (limit,)).fetchall()
        return [Failure(decode_text(name), reason, attempts, url or "")
                for name, reason, attempts, url in rows]

    def failure_count(self) -> int:
        return self._one("SELECT files_failed FROM run")[0]

    def failed_names(self) -> Iterator[tuple[int, str]]:
        """(page seq, name) of every failure, in that order, in chunks (safe to interleave
        with retry_succeeded / page_done on the same thread)."""
        for seq, failure in self.failure_rows():
            yield seq, failure.name

    def failure_rows(self) -> Iterator[tuple[int, Failure]]:
        """(page seq, Failure) of every failure, by seq and name, read in chunks."""
        after: tuple[int, str | bytes] | None = None
        columns = "SELECT seq, name, reason, attempts, url FROM failures"
        while True:
            with self._translated():
                if after is None:
                    rows = self._db.execute(f"{columns} ORDER BY seq, name LIMIT ?",
                                            (_CHUNK,)).fetchall()
                else:
                    rows = self._db.execute(
                        f"{columns} WHERE (seq, name) > (?, ?) ORDER BY seq, name LIMIT ?",
                        (*after, _CHUNK)).fetchall()
            for seq, name, reason, attempts, url in rows:
                yield seq, Failure(decode_text(name), reason, attempts, url or "")
            if len(rows) < _CHUNK:
                return
            after = rows[-1][:2]

    # -- lifetime

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            finally:
                unlock_dest(self._lock_fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
