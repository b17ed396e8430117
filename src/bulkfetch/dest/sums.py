"""DEST/.bulkfetch/sums: the md5sum lines of a directory destination, one file per worker.

The directory sink appends a line for every file it writes, a page at a time. The files are
a log: a file fetched again (a resumed page, `--restart`, a `--sync` pass) gets a newer line
in a newer file, and the latest line of a path is the one that holds (files oldest first by
modification time, then name; lines in file order). What needs one line per path (get
--sync's index, `hash --dest`) loads them into an SQLite table keyed by path, so memory
stays flat at any number of files.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import NamedTuple

from bulkfetch.dest.validators import (
    VALIDATORS_TABLE,
    companion_of,
    load_companion,
    write_companion,
)
from bulkfetch.util.checksum_lines import parse_line, sum_lines

__all__ = ["KEPT_TABLE", "SUMS_DIR", "Loaded", "load_latest", "sums_files"]

SUMS_DIR = ".bulkfetch/sums"
# `written`: the modification time (ns) of the sums file holding the line. The sink writes
# a file before its line, so a file modified later than that was changed in DEST since.
KEPT_TABLE = "CREATE TABLE IF NOT EXISTS kept (path TEXT PRIMARY KEY, md5 TEXT NOT NULL, " \
             "written INTEGER NOT NULL) WITHOUT ROWID"
_BATCH = 10_000
# A line as the directory sink writes it for a name that needs no escaping
_PLAIN = re.compile(rb"[0-9a-f]{32}  [^\\\n\r]+\n")


def has_sums(dest: Path) -> bool:
    """Whether DEST holds any sums file (one directory read, no stat of each)."""
    try:
        with os.scandir(Path(dest) / SUMS_DIR) as entries:
            return any(entry.name.endswith(".md5") for entry in entries)
    except OSError:
        return False


def sums_files(dest: Path) -> list[Path]:
    """DEST's sums files, oldest first."""
    sums = Path(dest) / SUMS_DIR
    if not sums.is_dir():
        return []
    return sorted((entry for entry in sums.iterdir() if entry.name.endswith(".md5")),
                  key=lambda entry: (entry.stat().st_mtime_ns, entry.name))


class Loaded(NamedTuple):
    files: dict[str, int]  # the sums files read: name -> size
    lines: int  # MD5 lines read (more than the paths kept: a path has older lines)
    improper: int  # lines that were not md5sum lines of an MD5


def load_latest(db: sqlite3.Connection, dest: Path) -> Loaded:
    """Fill `db`'s table `kept` (KEPT_TABLE, emptied first) with the latest MD5 of each path
    under DEST, and its table `validators` (made here) with the HTTP validators kept beside
    them (dest/validators.py), in one transaction."""
    files = sums_files(dest)
    read: dict[str, int] = {}
    improper = lines_read = 0
    db.execute(VALIDATORS_TABLE)
    db.execute("BEGIN")
    try:
        db.execute("DELETE FROM kept")
        db.execute("DELETE FROM validators")
        for file in files:
            batch: list[tuple[str, str, int]] = []
            with file.open("rb") as lines:
                info = os.fstat(lines.fileno())
                read[file.name], written = info.st_size, info.st_mtime_ns
                for line in lines:
                    if _PLAIN.fullmatch(line):  # as the sink writes a plain name: no regex
                        batch.append((os.fsdecode(line[34:-1]), line[:32].decode(), written))
                    else:
                        parsed = parse_line(line.rstrip(b"\n"))
                        if parsed is None or len(parsed.hexdigest) != 32 \
                                or parsed.algo not in (None, "md5"):
                            improper += 1
                            continue
                        batch.append((os.fsdecode(parsed.name), parsed.hexdigest, written))
                    if len(batch) >= _BATCH:
                        lines_read += _keep(db, batch)
            lines_read += _keep(db, batch)
            improper += load_companion(db, file, written)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return Loaded(read, lines_read, improper)


def _keep(db: sqlite3.Connection, batch: list[tuple[str, str, int]]) -> int:
    db.executemany("INSERT OR REPLACE INTO kept (path, md5, written) VALUES (?, ?, ?)", batch)
    count = len(batch)
    batch.clear()
    return count


def rewrite(db: sqlite3.Connection, dest: Path, exclude: str | None = None) -> Path:
    """Write `db`'s `kept` (less the paths in table `exclude`) as DEST's one sums file, in
    path order, and its `validators` beside it (both as load_latest() filled them), and
    remove the others. It is written beside them and renamed, then the
    older ones removed: a crash in between leaves it the newest, whose lines win. Returns
    its path; raises OSError."""
    sums = Path(dest) / SUMS_DIR
    compacted = sums / f"sums-{time.time_ns()}.md5"
    temporary = sums / (compacted.name + ".tmp")
    where = f" WHERE path NOT IN (SELECT path FROM {exclude})" if exclude else ""
    rows = db.execute(f"SELECT path, md5 FROM kept{where} ORDER BY path")
    try:
        # first, the validators (an orphan if a crash came now: no sums file names it);
        # load_latest() made their table
        write_companion(db, compacted, exclude)
        with open(temporary, "wb") as out:
            while batch := rows.fetchmany(_BATCH):
                out.write(sum_lines([(md5, path) for path, md5 in batch]))
            out.flush()
            os.fsync(out.fileno())
        os.rename(temporary, compacted)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        with contextlib.suppress(OSError):
            companion_of(compacted).unlink()
        raise
    for file in sums_files(dest):
        if file.name != compacted.name:
            file.unlink()
            with contextlib.suppress(FileNotFoundError):
                companion_of(file).unlink()
    return compacted


def compact(dest: Path) -> None:
    """Rewrite DEST's sums to the latest line of each path (after a complete `--restart`,
    whose lines supersede every earlier one); raises OSError or sqlite3.Error."""
    db = sqlite3.connect("", isolation_level=None)  # "": a private temporary file
    try:
        db.execute(KEPT_TABLE)
        load_latest(db, dest)
        rewrite(db, dest)
    finally:
        db.close()
