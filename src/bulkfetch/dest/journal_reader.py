"""`bulkfetch status DEST`: the journal's state, read without writing and without waiting on
a run that holds it."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bulkfetch.dest.journal import (
    DB_NAME,
    FAILURES_SQL,
    STATE_DIR,
    TOTALS_SQL,
    State,
    Totals,
    check_schema,
    corrupt_journal,
    decode_text,
    totals_of,
)
from bulkfetch.dest.lock import LOCK_NAME, lock_holder
from bulkfetch.dest.status_file import read_live
from bulkfetch.errors import NoJournal
from bulkfetch.models import Failure


@dataclass(frozen=True)
class Status:
    """What `bulkfetch status DEST` shows."""

    dest: str
    state: State
    totals: Totals
    fingerprint: dict[str, object] = field(default_factory=dict)
    pid: int | None = None  # the run holding the lock (state "running")
    last_error: str | None = None
    failures: tuple[Failure, ...] = ()  # the first 20 by page seq, name
    # A running run's status.json (bulkfetch/live.py): its numbers of the last second,
    # counted before the journal has them. None when no run is going on.
    live: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """What `bulkfetch status DEST --json` prints."""
        return {"dest": self.dest, "state": self.state, "pid": self.pid,
                "source": self.fingerprint.get("source"), "totals": asdict(self.totals),
                "last_error": self.last_error,
                "failures": [asdict(failure) for failure in self.failures],
                "live": self.live}


def _connect_readonly(path: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=10.0)
        conn.execute("PRAGMA user_version").fetchone()
        return conn
    except sqlite3.OperationalError:
        # a WAL file left by a killed run may need recovery, which read-only cannot do
        conn = sqlite3.connect(path, timeout=10.0)
        conn.execute("PRAGMA query_only = ON")
        return conn


def read_status(dest: Path) -> Status:
    """The journal's state for `bulkfetch status DEST`; never writes, never waits on a run."""
    dest = Path(dest)
    path = dest / STATE_DIR / DB_NAME
    if not path.is_file():
        if not dest.is_dir():
            what = "is not a directory" if os.path.lexists(dest) else "does not exist"
            raise NoJournal(f"{dest} {what}: give the DEST of a bulkfetch get")
        raise NoJournal(f"{dest} has no bulkfetch journal ({path} does not exist)")
    held, pid = lock_holder(dest / STATE_DIR / LOCK_NAME)
    try:
        conn = _connect_readonly(path)
    except sqlite3.DatabaseError as exc:
        raise corrupt_journal(path, f"cannot be read ({exc})") from None
    try:
        if not check_schema(conn, path):
            return Status(str(dest), "running" if held else "empty", Totals(), pid=pid)
        try:
            totals = totals_of(conn.execute(TOTALS_SQL).fetchone())
            fp_json, last_error = conn.execute(
                "SELECT fingerprint, last_error FROM run").fetchone()
            rows = conn.execute(FAILURES_SQL, (20,)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise corrupt_journal(path, f"is damaged ({exc})") from None
    finally:
        conn.close()
    try:
        fingerprint = json.loads(fp_json)
    except ValueError:
        fingerprint = {}
    state: State
    if held:
        state = "running"
    elif totals.listing_done and totals.pages_done == totals.pages_listed:
        state = "finished with failures" if totals.files_failed else "finished"
    elif totals.pages_listed == 0:
        state = "empty"
    else:
        state = "interrupted"
    failures = tuple(Failure(decode_text(n), r, a) for n, r, a in rows)
    live = None
    if held:  # the file of the run holding the lock, not one a killed run left
        found = read_live(dest)
        if found is not None and found.get("pid") == pid and found.get("state") == "running":
            live = found
    return Status(str(dest), state, totals, fingerprint, pid if held else None, last_error,
                  failures, live)
