"""`bulkfetch get --sync`: fetch again only what changed at the source since DEST was filled.

What DEST holds is known by the MD5 of every file the directory sink wrote (its md5sum lines
in DEST/.bulkfetch/sums, appended a page at a time; a later line of a path wins). A sync
pass lists the source again from its first page and, for each listed file present in DEST:

- when the listing states its size and MD5 (S3, a single-part ETag) and both are the file's,
  it is not asked for at all;
- else it is asked for with `If-None-Match: "<its MD5>"`, or, when the server that sent it
  gave another ETag or only a Last-Modified (dest/validators.py), with that: `If-None-Match:
  <its ETag>` or `If-Modified-Since: <its Last-Modified>`. An unchanged file is answered
  304 and stays as it is, same inode and mtime, on S3, stock nginx, Apache and
  python -m http.server alike. A server that ignores conditional requests answers 200: the
  directory sink compares that body with DEST's copy and leaves an equal one as it is;
- with --checksum, only content counts: the listing's MD5, or a request with the MD5
  alone (a 304 from a server whose ETags are MD5s, else a body compared as above); never
  the listing's size and time, nor another server's ETag.

A listed file missing from DEST, without a recorded MD5, or modified in DEST after its sums
line was written (its mtime is later than its sums file's: edited by hand, so the recorded
MD5 is no longer its own) is fetched as usual. With
--delete, once a pass has listed the source to its end, the files under DEST that it did not
list are removed, through directory descriptors, never following a symlink, never inside
DEST/.bulkfetch, and the directories this leaves empty with them; --dry-run lists them and
removes nothing. --delete removes nothing at all when the listing held no file or when it
would remove more than --max-delete (N files or P% of DEST) allows.

The index (DEST/.bulkfetch/sync.sqlite) keeps the recorded MD5s by path, rebuilt from the
sums at each start, and the paths a pass listed, kept across an interrupted pass: memory
does not grow with the number of files. Those paths are tied to their pass (the time the
journal listed its first page): --delete refuses to judge a pass they do not cover, as when
a plain `get` was interrupted and a `--sync --delete` would resume it.

A pass that ends complete and changed DEST (fetched a file again, or removed one) rewrites
the sums as one file, a line per file DEST holds: the lines of a file's older versions and
of removed files go, so that `bulkfetch hash --dest DEST` and `md5sum -c`, which check every
line, hold DEST to what it is now rather than to what it was.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import sqlite3
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from bulkfetch.config import DeleteLimit, GetOptions
from bulkfetch.dest.sums import KEPT_TABLE, SUMS_DIR, load_latest, rewrite, sums_files
from bulkfetch.dest.validators import conditional_headers
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.util.names import local_parts

INDEX_NAME = "sync.sqlite"
STATE_DIR = ".bulkfetch"
_BATCH = 500  # paths a query asks for at once (SQLite's limit on variables is 32,766)
# A listing's time may be cut to the minute (nginx's and Apache's HTML): a file is taken as
# unchanged only when its listed time is this much before DEST stored it.
MTIME_SLACK_S = 60
_UNKNOWN = ("", 0, "", "")  # a path with no sums line


class SyncIndex:
    def __init__(self, dest: Path, fanout: int, new_pass: bool,
                 path: Path | None = None, taken: Callable[[str], bool] | None = None,
                 checksum: bool = False) -> None:
        """Open (or make) the index of `dest` (at `path`: a dry run's own, elsewhere);
        `new_pass`: the source is listed again from its start, so the paths listed by the
        last pass are forgotten. `taken`: the run's --include/--exclude filter; a file whose
        name it does not take is never gone (as for rsync, rclone and `aws s3 sync`)."""
        self.dest = Path(dest)
        self.fanout = fanout
        self.checksum = checksum  # --checksum: by content only (no size and time, no ETag)
        self.taken = taken
        self.path = path or self.dest / STATE_DIR / INDEX_NAME
        self.sums_read: dict[str, int] = {}  # the sums files _load_sums() read: their sizes
        self.superseded = 0  # lines of theirs a later line of the same path overrides
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None)
            self.db.executescript(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;"
                # `kept` is rebuilt from the sums at every start (a version before its
                # `written` column left a table without it)
                f"DROP TABLE IF EXISTS kept; {KEPT_TABLE};"
                "CREATE TABLE IF NOT EXISTS listed (path TEXT PRIMARY KEY) WITHOUT ROWID;"
                # one row: the pass `listed` belongs to (the journal's pass_key(), NULL until
                # its first page is listed); no row: `listed` belongs to no known pass
                "CREATE TABLE IF NOT EXISTS pass (key REAL);"
                "CREATE TEMP TABLE removed (path TEXT PRIMARY KEY) WITHOUT ROWID;")
            if new_pass:
                self.db.execute("BEGIN")
                self.db.execute("DELETE FROM listed")
                self.db.execute("DELETE FROM pass")
                self.db.execute("INSERT INTO pass (key) VALUES (NULL)")
                self.db.execute("COMMIT")
            if path is None:  # (a dry run compares nothing)
                self._load_sums()
        except sqlite3.Error as exc:
            raise BulkfetchError(f"cannot use the sync index {self.path}: {exc}") from None
        self.unchanged = 0  # files a listing showed equal to DEST's: not asked for
        self.changed_here = 0  # files modified in DEST since stored: fetched whole again

    def note_pass(self, key: float | None) -> None:
        """The pass's first page was listed (at `key`, the journal's pass_key())."""
        self.db.execute("UPDATE pass SET key = ? WHERE key IS NULL", (key,))

    def covers(self, key: float | None) -> bool:
        """Whether `listed` holds every path the journal's pass (`key`) listed: it is a
        --sync pass this index saw from its first page. Not so when a plain `get` left the
        pass unfinished (its pages listed before this --sync were never noted here)."""
        row = self.db.execute("SELECT key FROM pass").fetchone()
        return row is not None and row[0] == key  # (None == None: begun, page 0 not listed)

    def _load_sums(self) -> None:
        """The MD5 of each path, the latest line of it winning (dest/sums.py)."""
        loaded = load_latest(self.db, self.dest)
        kept = self.db.execute("SELECT count(*) FROM kept").fetchone()[0]
        self.sums_read, self.superseded = loaded.files, loaded.lines - kept

    def local_path(self, name: str) -> str:
        return "/".join(local_parts(name, self.fanout))

    def _kept(self, paths: Sequence[str]) -> dict[str, tuple[str, int, str, str]]:
        """path -> (its recorded MD5, when its sums line was written: sums.KEPT_TABLE, and
        the ETag and Last-Modified kept with that line: dest/validators.py, "" if none)."""
        found: dict[str, tuple[str, int, str, str]] = {}
        for start in range(0, len(paths), _BATCH):
            chunk = paths[start:start + _BATCH]
            for path, md5, written, etag, modified in self.db.execute(
                    "SELECT k.path, k.md5, k.written, v.etag, v.modified FROM kept k "
                    "LEFT JOIN validators v ON v.path = k.path AND v.written = k.written "
                    f"WHERE k.path IN ({','.join('?' * len(chunk))})", chunk):
                found[path] = (md5, written, etag or "", modified or "")
        return found

    def record_listed(self, names: Sequence[str]) -> list[str]:
        """Note `names` as listed by this pass; their paths under DEST."""
        paths = [self.local_path(name) for name in names]
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR IGNORE INTO listed (path) VALUES (?)",
                            [(path,) for path in paths])
        self.db.execute("COMMIT")
        return paths

    def _size(self, path: str) -> int | None:
        """The size of DEST/`path` if it is a regular file (a symlink is not ours)."""
        found = self._stat(path)
        return found.st_size if found is not None else None

    def _stat(self, path: str) -> os.stat_result | None:
        """DEST/`path`'s status if it is a regular file (a symlink is not ours)."""
        try:
            found = os.lstat(self.dest / path)
        except OSError:
            return None
        return found if stat.S_ISREG(found.st_mode) else None

    def plan(self, items: Sequence[str], names: Sequence[str],
             sizes: Sequence[int] | None, md5s: Sequence[str] | None,
             mtimes: Sequence[int] | None = None) -> tuple[list[int], tuple[str, ...]]:
        """For a listed page's `items` (resolved to `names`; `sizes`, `md5s` and `mtimes`
        when the listing states them): the positions still to fetch and, for each of those,
        its request's extra header lines ("" for none). Records every name as listed."""
        paths = self.record_listed(names)
        kept = self._kept(paths)
        checksum = self.checksum
        fetch: list[int] = []
        headers: list[str] = []
        for at, path in enumerate(paths):
            md5, written, etag, modified = kept.get(path, _UNKNOWN)
            found = self._stat(path) if md5 else None
            if found is None or found.st_mtime_ns > written:
                # not in DEST, nothing known of it, or changed in DEST since it was stored
                # (modified after its sums line was written): the recorded MD5 is not its
                if found is not None:
                    self.changed_here += 1
                fetch.append(at)
                headers.append("")
                continue
            if sizes is not None and md5s is not None and md5s[at] == md5 \
                    and sizes[at] == found.st_size:
                self.unchanged += 1  # the listing says it is the same file
                continue
            if checksum:
                fetch.append(at)
                headers.append(f'If-None-Match: "{md5}"')
                continue
            if sizes is not None and mtimes is not None and sizes[at] == found.st_size \
                    and mtimes[at] >= 0 and (mtimes[at] + MTIME_SLACK_S) * 10**9 <= written:
                # a directory listing's size and time: the same size, and last changed at
                # the source before DEST stored it (rsync's quick check, in the listing's
                # whole minutes)
                self.unchanged += 1
                continue
            fetch.append(at)
            headers.append(conditional_headers(md5, etag, modified))
        return fetch, tuple(headers)

    # -- what the source no longer lists ----------------------------------------------------
    def _entries(self) -> Iterator[tuple[int, str, str, bool]]:
        """(directory fd, entry name, path under DEST, whether it is gone) of every file
        under DEST outside DEST/.bulkfetch: gone when the pass did not list it and speaks
        for it. The fd is valid until the next item. DEST itself may be a symlink (the
        user named it); nothing under it is followed."""
        root = os.open(self.dest, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for top, dirs, files, dir_fd in os.fwalk(".", dir_fd=root, follow_symlinks=False):
                relative = os.path.normpath(top)
                prefix = "" if relative == "." else relative + "/"
                if not prefix:
                    dirs[:] = [d for d in dirs if d != STATE_DIR]
                dirs.sort()
                # a symlink to a directory is listed among the directories, but is an entry
                # of ours to judge like a file (fwalk does not go into it)
                entries = sorted(files + [d for d in dirs if stat.S_ISLNK(
                    os.stat(d, dir_fd=dir_fd, follow_symlinks=False).st_mode)])
                paths = [prefix + entry for entry in entries]
                listed = self._listed(paths)
                for entry, path in zip(entries, paths, strict=True):
                    yield dir_fd, entry, path, path not in listed and self._judged(path)
        finally:
            os.close(root)

    def gone(self) -> Iterator[tuple[int, str, str]]:
        """(directory fd, entry name, path under DEST) of every file under DEST, outside
        DEST/.bulkfetch, that the pass did not list. The fd is valid until the next item."""
        return ((dir_fd, entry, path) for dir_fd, entry, path, gone in self._entries()
                if gone)

    def census(self, each: Callable[[str], None] | None = None) -> tuple[int, int]:
        """(files gone, files DEST holds outside DEST/.bulkfetch), in one walk; `each` is
        told the path of every file gone (what --dry-run prints)."""
        gone = held = 0
        for _, _, path, is_gone in self._entries():
            held += 1
            if is_gone:
                gone += 1
                if each is not None:
                    each(path)
        return gone, held

    def _judged(self, path: str) -> bool:
        """Whether the pass speaks for `path`: with filters, only for the names they take
        (an excluded file was left out of the listing, not removed from the source)."""
        if self.taken is None:
            return True
        name = path.split("/", self.fanout)[-1] if self.fanout else path
        return self.taken(name)

    def _listed(self, paths: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(paths), _BATCH):
            chunk = paths[start:start + _BATCH]
            found.update(row[0] for row in self.db.execute(
                f"SELECT path FROM listed WHERE path IN ({','.join('?' * len(chunk))})",
                chunk))
        return found

    def refusal(self, limit: DeleteLimit | None,
                counted: tuple[int, int] | None = None) -> str | None:
        """Why --delete must remove nothing at all this pass (None: it may go on): the
        listing held no file, or it would remove more than --max-delete allows. `counted`:
        census() already taken (else it is taken here, when a reason needs it)."""
        empty = self.db.execute("SELECT 1 FROM listed LIMIT 1").fetchone() is None
        if not empty and limit is None:
            return None
        gone, held = counted if counted is not None else self.census()
        if not gone:
            return None
        if empty:
            # An empty listing is more often a server's or a path's mistake than a source
            # emptied on purpose, and it would take every file: nothing is removed.
            return ("the source listed no file at all, so --delete would empty DEST: "
                    "nothing was removed (check the URL; if the source is really empty, "
                    "remove the files yourself)")
        if limit is not None and not limit.allows(gone, held):
            return (f"--delete would remove {gone:,} of the {held:,} files in DEST "
                    f"({100 * gone / held:.3g}%), more than --max-delete {limit} allows: "
                    "nothing was removed (see them with --dry-run; raise --max-delete if "
                    "the source really no longer has them)")
        return None

    def delete_gone(self, limit: DeleteLimit | None = None) -> int:
        """Remove the files the pass did not list (census() names them without removing);
        returns how many. A directory the removals leave empty goes too. Raises
        UsageError, removing nothing, when refusal() says why."""
        if (why := self.refusal(limit)) is not None:
            raise UsageError(why)
        removed = 0
        emptied: set[str] = set()
        for dir_fd, entry, path in self.gone():
            try:
                os.unlink(entry, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise BulkfetchError(f"cannot remove {self.dest / path}: "
                                     f"{exc.strerror}") from None
            self.db.execute("INSERT OR IGNORE INTO removed (path) VALUES (?)", (path,))
            emptied.add(path.rpartition("/")[0])
            removed += 1
        emptied.discard("")
        if emptied:
            remove_emptied(self.dest, emptied)
        return removed

    def compact_sums(self) -> bool:
        """After a complete pass: when it wrote sums lines, removed files, or found lines
        superseded (an interrupted pass's), rewrite DEST's sums as one file holding the
        latest line of each file still there (sums.rewrite()). Returns whether it did."""
        files = sums_files(self.dest)
        removed = self.db.execute("SELECT count(*) FROM removed").fetchone()[0]
        if not removed and not self.superseded \
                and {f.name: f.stat().st_size for f in files} == self.sums_read:
            return False
        self._load_sums()  # with this pass's lines, the latest of each path winning
        try:
            compacted = rewrite(self.db, self.dest, exclude="removed")
        except OSError as exc:
            raise BulkfetchError(f"cannot rewrite the checksums in {self.dest / SUMS_DIR}: "
                                 f"{exc.strerror}") from None
        self.db.execute("DELETE FROM removed")
        self.sums_read, self.superseded = {compacted.name: compacted.stat().st_size}, 0
        return True

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()


def remove_emptied(dest: Path, directories: set[str]) -> int:
    """Remove each of `directories` (paths under `dest`) that is now empty, and then each
    parent that this leaves empty, up to but never `dest`; deepest first, every step
    through directory fds that follow no symlink. Returns how many went."""
    pending = [(-path.count("/"), path) for path in directories]
    heapq.heapify(pending)
    seen = set(directories)
    removed = 0
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while pending:
            _, path = heapq.heappop(pending)
            parent, _, leaf = path.rpartition("/")
            if not _rmdir_if_empty(root, parent, leaf):
                continue
            removed += 1
            if parent and parent not in seen:
                seen.add(parent)
                heapq.heappush(pending, (-parent.count("/"), parent))
    finally:
        os.close(root)
    return removed


def _rmdir_if_empty(root: int, parent: str, leaf: str) -> bool:
    fds: list[int] = []
    try:
        at = root
        for part in parent.split("/") if parent else ():
            at = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=at)
            fds.append(at)
        os.rmdir(leaf, dir_fd=at)  # only ever an empty directory; never a symlink's target
        return True
    except OSError:  # not empty (a file the pass kept, or one of the user's), or gone
        return False
    finally:
        for fd in fds:
            os.close(fd)


def listing_filter(options: GetOptions) -> Callable[[str], bool] | None:
    """The names the run's --include/--exclude take (None: no filter)."""
    from bulkfetch.util.globs import key_filter

    chosen = options.crawl if options.crawl is not None else options.s3
    return key_filter(chosen.include, chosen.exclude)


def dry_run(options: GetOptions, show: Callable[[str], None]
            ) -> tuple[int, int, int, str | None]:
    """`get --sync --dry-run`: list the source to its end and show (through `show`) each
    file under DEST that --delete would remove. Fetches, writes and removes nothing in
    DEST (the index of the listed paths lives in a temporary directory). Returns (files
    listed, listed files DEST lacks, files --delete would remove, why it would remove none
    of them or None). Raises BulkfetchError (UsageError for what the user must fix) when
    the listing fails."""
    from bulkfetch.listing.lister import ListingFailed, ListingFinished
    from bulkfetch.listing.range_lister import lister_from_start
    from bulkfetch.sources import make_source
    from bulkfetch.sources.base import unusable_name

    source = make_source(options)
    listed = missing = 0
    with tempfile.TemporaryDirectory(prefix="bulkfetch-dry-run-") as work:
        index = SyncIndex(Path(options.dest), options.sink.fanout, True,
                          Path(work) / INDEX_NAME, taken=listing_filter(options))
        lister = lister_from_start(source, options)
        try:
            lister.start()
            while True:
                event = lister.out.get()
                if isinstance(event, ListingFinished):
                    break
                if isinstance(event, ListingFailed):
                    raise (UsageError if event.usage else BulkfetchError)(event.message)
                names = []
                for item in dict.fromkeys(event.page.items):
                    try:
                        names.append(source.resolve(item)[0])
                    except ValueError:
                        names.append(unusable_name(item))
                for path in index.record_listed(names):
                    listed += 1
                    missing += index._size(path) is None
            counted = index.census(each=show)
            refusal = index.refusal(options.sync.max_delete, counted)
        finally:
            lister.stop()
            index.close()
    return listed, missing, counted[0], refusal
