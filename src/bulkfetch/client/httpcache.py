"""A persistent HTTP cache in a directory, keyed by URL, shared by every process that opens
it (a Client's `cache_dir=`; the rules of what to keep are freshness.py's).

    DIR/index.sqlite    one row per URL (WAL: readers never wait for the writer; short
                        write transactions, a busy timeout for the other processes')
    DIR/data/ab/HASH-TOKEN   a body: HASH from the URL, TOKEN fresh for every write
    DIR/data/ab/.PID-TOKEN   a body being written

A body is written to a temporary beside its final place (a rename across directories cost
450 us a file here against 57 us within one, ext4) and renamed to a name never used before:
a name, once visible, holds the same complete bytes until it is unlinked (never rewritten).
The row names its file and size. A reader takes the row, opens that file and checks the
length; a file gone in between (replaced or evicted by another process, which unlinks only
after its transaction removed the row) is a miss. So no reader returns a torn body or
another URL's. No fsync: a cache may lose entries in a power cut (SQLite's synchronous=NORMAL
rolls back the last transactions; a file renamed just before may come back empty, which the
size check turns into a miss). What a crash leaves (a temporary, a file whose row never
committed or whose unlink never ran) is removed by sweep().

`max_bytes` bounds the bodies' bytes: each store evicts the least recently used rows in
its own transaction (a running total kept by triggers, so every process sees the same sum),
then unlinks their files.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bulkfetch.client.freshness import freshness
from bulkfetch.errors import UsageError
from bulkfetch.util.md5 import md5_hex

__all__ = ["Entry", "HttpCache"]

INDEX = "index.sqlite"
APPLICATION_ID = 0x62664843  # "bfHC": this file is a bulkfetch HTTP cache index
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0  # another process's write transaction: milliseconds, rarely more
# Hits move an entry's last_used (its place in the LRU order). Written on each hit that
# would be a write transaction per read, and a write lock the other processes wait for:
# hits are collected and written together every TOUCH_EVERY_S or TOUCH_BATCH hits, and
# before this process evicts. An LRU order late by a second is still an LRU order.
TOUCH_EVERY_S = 1.0
TOUCH_BATCH = 512
EVICT_BATCH = 64  # rows looked at per eviction query
# sweep(): a temporary younger than this may be another process's write in progress
SWEEP_GRACE_S = 3600.0

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS entries (
    url TEXT PRIMARY KEY,
    file TEXT NOT NULL,          -- under data/: HASH[:2]/HASH[2:32]-TOKEN
    size INTEGER NOT NULL,
    md5 TEXT NOT NULL,
    stored_at REAL NOT NULL,     -- Unix time the body was received
    expires_at REAL NOT NULL,    -- fresh until then (never, with no_cache)
    etag TEXT NOT NULL,          -- validators, "" when the server gave none
    last_modified TEXT NOT NULL,
    control TEXT NOT NULL,       -- its Cache-Control, for a 304 that states none
    no_cache INTEGER NOT NULL,
    last_used REAL NOT NULL      -- LRU order
);
CREATE INDEX IF NOT EXISTS entries_lru ON entries (last_used);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 0), bytes INTEGER NOT NULL, count INTEGER NOT NULL);
INSERT OR IGNORE INTO totals VALUES (0, 0, 0);
CREATE TRIGGER IF NOT EXISTS entries_in AFTER INSERT ON entries BEGIN
    UPDATE totals SET bytes = bytes + NEW.size, count = count + 1; END;
CREATE TRIGGER IF NOT EXISTS entries_out AFTER DELETE ON entries BEGIN
    UPDATE totals SET bytes = bytes - OLD.size, count = count - 1; END;
CREATE TRIGGER IF NOT EXISTS entries_size AFTER UPDATE OF size ON entries BEGIN
    UPDATE totals SET bytes = bytes - OLD.size + NEW.size; END;
PRAGMA user_version = {SCHEMA_VERSION};
PRAGMA application_id = {APPLICATION_ID};
"""

_COLUMNS = "url, file, size, md5, stored_at, expires_at, etag, last_modified, control, no_cache"


@dataclass(frozen=True, slots=True)
class Entry:
    """A stored response, as its row says."""

    url: str
    file: str
    size: int
    md5: str
    stored_at: float
    expires_at: float
    etag: str
    last_modified: str
    control: str
    no_cache: bool

    def fresh(self, now: float) -> bool:
        return not self.no_cache and self.expires_at > now

    def conditional_headers(self) -> tuple[str, ...]:
        """The request headers that revalidate it: If-None-Match, If-Modified-Since."""
        headers = []
        if self.etag:
            headers.append(f"If-None-Match: {self.etag}")
        if self.last_modified:
            headers.append(f"If-Modified-Since: {self.last_modified}")
        return tuple(headers)


class HttpCache:
    """The store. `lookup(url)` -> the body (fresh), an Entry (stale: revalidate it with its
    conditional_headers()), or None; `store()` a 200's body with its headers;
    `refresh()` a 304. Thread-safe; in a forked child, open a new one. Counters:
    hits, stale, misses, revalidated, stored, evicted (this object's, not the directory's).

    `ttl`: seconds a response with no freshness information of its own is fresh (no
    Cache-Control max-age, no Expires, no no-cache); None: such a response is stale at once
    and kept only for its validators (each use is a conditional request)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 1 << 30,
                 ttl: float | None = None, clock: Callable[[], float] = time.time) -> None:
        if max_bytes < 1:
            raise UsageError(f"the disk cache's max_bytes must be at least 1, got {max_bytes}")
        if ttl is not None and ttl < 0:
            raise UsageError(f"the disk cache's ttl must be >= 0 seconds, got {ttl}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.clock = clock
        self.data = self.directory / "data"
        try:
            for folder in (self.directory, self.data):
                folder.mkdir(parents=True, exist_ok=True)
            if not os.access(self.directory, os.W_OK | os.X_OK):
                raise PermissionError(f"no write permission on {self.directory}")
        except OSError as exc:
            raise UsageError(f"cache directory {str(self.directory)!r} is unusable: "
                             f"{exc.strerror or exc}") from exc
        self.lock = threading.Lock()
        self.db = self._connect()
        self.touched: dict[str, float] = {}
        self.touched_at = clock()
        self.hits = self.stale = self.misses = self.revalidated = self.stored = 0
        self.evicted = 0

    def _connect(self) -> sqlite3.Connection:
        # Two processes opening a new directory at once: the switch to WAL can answer
        # "locked" at once, without the busy handler's wait. So the opening is retried.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                return self._open_index()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise UsageError(f"cache index in {str(self.directory)!r} is unusable: "
                                     f"{exc}") from exc
                time.sleep(0.01)

    def _open_index(self) -> sqlite3.Connection:
        path = self.directory / INDEX
        db = None
        try:
            db = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_S,
                                 check_same_thread=False)  # used under self.lock
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")  # WAL: no fsync per commit
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            if app_id not in (0, APPLICATION_ID):
                raise UsageError(f"{path} is not a bulkfetch cache index")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise UsageError(f"{path} was made by a newer bulkfetch (schema {version})")
            if version < SCHEMA_VERSION:  # new: made once (idempotent if two race here)
                db.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} COMMIT;")
        except (sqlite3.OperationalError, UsageError):
            if db is not None:
                db.close()
            raise  # (_connect() retries a locked index)
        except sqlite3.DatabaseError as exc:
            if db is not None:
                db.close()
            raise UsageError(f"cache index {str(path)!r} is unusable: {exc}") from exc
        return db

    # -- reading -------------------------------------------------------------------------
    def lookup(self, url: str) -> bytes | Entry | None:
        """The fresh body kept for `url`; else its stale Entry (to revalidate); else None
        (never kept, evicted, or its file gone)."""
        with self.lock:
            row = self.db.execute(f"SELECT {_COLUMNS} FROM entries WHERE url = ?",
                                  (url,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        entry = Entry(*row)
        now = self.clock()
        if not entry.fresh(now):
            self.stale += 1
            return entry
        body = self._read(entry)
        if body is None:  # replaced or evicted since the row was read: a miss
            self.misses += 1
            return None
        self.hits += 1
        with self.lock:
            self.touched[url] = now
            if len(self.touched) >= TOUCH_BATCH or now - self.touched_at >= TOUCH_EVERY_S:
                with self._transaction():
                    self._write_touches()
        return body

    def _read(self, entry: Entry) -> bytes | None:
        try:
            with open(self.data / entry.file, "rb") as handle:
                body = handle.read(entry.size + 1)
        except FileNotFoundError:
            return None
        return body if len(body) == entry.size else None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """(under self.lock) One write transaction: taken at once (IMMEDIATE), so two
        processes never deadlock upgrading read locks; rolled back on any error."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _write_touches(self) -> None:
        """(in a write transaction) The hits collected since the last write."""
        touched, self.touched = self.touched, {}
        self.touched_at = self.clock()
        if touched:
            self.db.executemany(
                "UPDATE entries SET last_used = ?1 WHERE url = ?2 AND last_used < ?1",
                [(when, url) for url, when in touched.items()])

    # -- writing -------------------------------------------------------------------------
    def store(self, url: str, body: bytes, headers: dict[str, str],
              md5: str | None = None) -> bool:
        """Keep a 200's `body` for `url` as its `headers` (freshness.response_headers())
        allow; True when kept."""
        return self.store_many(((url, body, headers, md5),)) == 1

    def store_many(self, items: Iterable[tuple[str, bytes, dict[str, str], str | None]],
                   ) -> int:
        """store() for many responses, in one transaction; how many were kept."""
        now = self.clock()
        written: list[tuple[object, ...]] = []
        try:
            for url, body, headers, md5 in items:
                rule = freshness(headers, now, self.ttl)
                if not rule.store or len(body) > self.max_bytes:
                    continue
                written.append((url, self._write_file(url, body), len(body),
                                md5 or md5_hex(body), now, now + rule.lifetime, rule.etag,
                                rule.last_modified, headers.get("cache-control", ""),
                                int(rule.no_cache), now))
            if not written:
                return 0
            with self.lock:
                unlink = self._commit_rows(written)
        except BaseException:
            for row in written:  # not in the index: nobody else can know these names
                self._unlink(str(row[1]))
            raise
        for name in unlink:
            self._unlink(name)
        self.stored += len(written)
        return len(written)

    def _write_file(self, url: str, body: bytes) -> str:
        digest = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()
        folder = f"{self.data}/{digest[:2]}"
        token = secrets.token_hex(8)
        temporary = f"{folder}/.{os.getpid()}-{token}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(temporary, flags, 0o644)
        except FileNotFoundError:  # its fan-out folder is new
            os.makedirs(folder, exist_ok=True)
            fd = os.open(temporary, flags, 0o644)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        name = f"{digest[:2]}/{digest[2:32]}-{token}"
        try:
            os.rename(temporary, f"{self.data}/{name}")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        return name

    def _commit_rows(self, rows: list[tuple[object, ...]]) -> list[str]:
        """(under self.lock) Insert or replace `rows`, evict down to max_bytes; the files
        to unlink once committed (the replaced and the evicted)."""
        db = self.db
        unlink: list[str] = []
        with self._transaction():
            self._write_touches()  # this process's hits count before anything is evicted
            for row in rows:
                old = db.execute("SELECT file FROM entries WHERE url = ?",
                                 (row[0],)).fetchone()
                if old is not None:
                    unlink.append(old[0])
                db.execute(
                    f"INSERT INTO entries ({_COLUMNS}, last_used) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (url) DO UPDATE SET "
                    "file = excluded.file, size = excluded.size, md5 = excluded.md5, "
                    "stored_at = excluded.stored_at, expires_at = excluded.expires_at, "
                    "etag = excluded.etag, last_modified = excluded.last_modified, "
                    "control = excluded.control, no_cache = excluded.no_cache, "
                    "last_used = excluded.last_used", row)
            unlink += self._evict()
        return unlink

    def _evict(self) -> list[str]:
        """(in a write transaction) Remove least recently used rows while the bodies exceed
        max_bytes; their files."""
        db = self.db
        files: list[str] = []
        total = db.execute("SELECT bytes FROM totals").fetchone()[0]
        while total > self.max_bytes:
            oldest = db.execute("SELECT url, file, size FROM entries ORDER BY last_used "
                                "LIMIT ?", (EVICT_BATCH,)).fetchall()
            if not oldest:
                break
            gone = []
            for url, file, size in oldest:
                gone.append((url,))
                files.append(file)
                total -= size
                if total <= self.max_bytes:
                    break
            db.executemany("DELETE FROM entries WHERE url = ?", gone)
            self.evicted += len(gone)
        return files

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # (gone already: tolerated)
            os.unlink(self.data / name)

    def refresh(self, entry: Entry, headers: dict[str, str]) -> bytes | None:
        """A 304 answered the conditional request made for `entry`: its freshness and
        validators are renewed from the 304's `headers` (those it does not state stay), and
        its body is returned. None when the entry was replaced or evicted meanwhile (its
        file is no longer the one the row names): then the URL must be asked for again."""
        return self.refresh_many(((entry, headers),))[0]

    def refresh_many(self, answers: Iterable[tuple[Entry, dict[str, str]]],
                     ) -> list[bytes | None]:
        """refresh() for many 304s, in one transaction."""
        now = self.clock()
        # (entry, what became of its row): "renewed"; "once" (the 304 says no-store: this
        # answer, then never again); "gone" (replaced or evicted meanwhile)
        renewed: list[tuple[Entry, str]] = []
        with self.lock, self._transaction():
            for entry, headers in answers:
                merged = {"etag": entry.etag, "last-modified": entry.last_modified,
                          "cache-control": entry.control}
                merged.update(headers)
                rule = freshness(merged, now, self.ttl)
                if not rule.store:
                    renewed.append((entry, "once"))
                    continue
                changed = self.db.execute(
                    "UPDATE entries SET expires_at = ?, etag = ?, last_modified = ?, "
                    "control = ?, no_cache = ?, last_used = ? WHERE url = ? AND file = ?",
                    (now + rule.lifetime, rule.etag, rule.last_modified,
                     merged.get("cache-control", ""), int(rule.no_cache), now, entry.url,
                     entry.file)).rowcount
                renewed.append((entry, "renewed" if changed else "gone"))
        bodies: list[bytes | None] = []
        for entry, became in renewed:
            body = self._read(entry) if became != "gone" else None
            if became == "once" or (became == "renewed" and body is None):
                self.forget(entry)  # (no-store, or its file is unreadable)
            if body is not None:
                self.revalidated += 1
            bodies.append(body)
        return bodies

    def forget(self, entry: Entry) -> None:
        """Drop `entry` (a 304 came back for a body that can no longer be read)."""
        with self.lock:
            changed = self.db.execute("DELETE FROM entries WHERE url = ? AND file = ?",
                                      (entry.url, entry.file)).rowcount
        if changed:
            self._unlink(entry.file)

    # -- upkeep --------------------------------------------------------------------------
    def sweep(self, grace_s: float = SWEEP_GRACE_S) -> int:
        """Remove what crashes left: temporaries older than `grace_s`, and data files no row
        names that are older than `grace_s` (a younger one may be another process's store
        about to commit). How many files went."""
        cutoff = time.time() - grace_s
        with self.lock:
            named = {row[0] for row in self.db.execute("SELECT file FROM entries")}
        removed = 0
        candidates = [(path, f"{folder.name}/{path.name}")
                      for folder in self.data.iterdir() if folder.is_dir()
                      for path in folder.iterdir()]
        for path, name in candidates:
            if name in named:
                continue
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed

    def totals(self) -> tuple[int, int]:
        """(entries, bytes) in the directory, as the index counts them."""
        with self.lock:
            count, size = self.db.execute("SELECT count, bytes FROM totals").fetchone()
        return count, size

    def flush(self) -> None:
        """Write the hits not yet written (close() does)."""
        with self.lock:
            if self.touched:
                with self._transaction():
                    self._write_touches()

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.flush()
        self.db.close()

    def __enter__(self) -> HttpCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
