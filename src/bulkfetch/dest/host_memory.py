"""What `--concurrency auto` learned of each host, kept beside the journal so that a resumed
run starts near it instead of from a few transfers: the limit a worker had reached for the
host and the lowest latency it saw there (engine/adaptive.py).

A table of its own in the journal's SQLite file, made when first written: a journal an
older bulkfetch wrote is read as before (the schema check counts tables only to tell an
empty file), and a DEST without one simply starts from scratch. Memory is advice: any
error reading or writing it is ignored, and the run goes on as it would have without.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from bulkfetch.dest.journal import DB_NAME, STATE_DIR

KEPT = 8  # hosts remembered, the highest limits first: what crosses to workers stays tiny
STALE_S = 7 * 24 * 3600.0  # older than this, a host's conditions are not worth trusting

# (host, limit per worker, lowest latency seen in seconds: 0.0 when none)
Learned = tuple[str, int, float]

_TABLE = ("CREATE TABLE IF NOT EXISTS host_memory (host TEXT PRIMARY KEY, per_worker INTEGER "
          "NOT NULL, latency_floor REAL, at REAL NOT NULL)")


def _path(dest: Path) -> Path:
    return Path(dest) / STATE_DIR / DB_NAME


def recall(dest: Path, now: float | None = None) -> tuple[Learned, ...]:
    """The hosts a former run into `dest` learned, if any (nothing on any error)."""
    path = _path(dest)
    if not path.is_file():
        return ()
    now = time.time() if now is None else now
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                                timeout=1.0)) as conn:
            rows = conn.execute(
                "SELECT host, per_worker, latency_floor FROM host_memory WHERE at >= ? "
                "ORDER BY per_worker DESC LIMIT ?", (now - STALE_S, KEPT)).fetchall()
    except sqlite3.Error:  # no such table (never written, an older journal), or damaged
        return ()
    return tuple((str(host), max(1, int(limit)), float(floor or 0.0))
                 for host, limit, floor in rows)


def remember(dest: Path, learned: Iterable[Learned]) -> None:
    """Keep what the workers `learned` for the next run: per host, the mean of their limits
    and the lowest of their latency floors."""
    path = _path(dest)
    limits: dict[str, list[int]] = {}
    floors: dict[str, float] = {}
    for host, limit, floor in learned:
        limits.setdefault(host, []).append(limit)
        if 0.0 < floor < floors.get(host, math.inf):
            floors[host] = floor
    if not limits or not path.is_file():  # (connect() would make a file no journal reads)
        return
    now = time.time()
    rows = [(host, max(1, round(sum(seen) / len(seen))), floors.get(host), now)
            for host, seen in sorted(limits.items(), key=lambda item: -max(item[1]))[:KEPT]]
    with contextlib.suppress(sqlite3.Error, OSError), \
            contextlib.closing(sqlite3.connect(path, timeout=5.0)) as conn, conn:
        conn.execute(_TABLE)
        conn.executemany("INSERT INTO host_memory VALUES (?, ?, ?, ?) ON CONFLICT (host) DO "
                         "UPDATE SET per_worker = excluded.per_worker, latency_floor = "
                         "excluded.latency_floor, at = excluded.at", rows)
