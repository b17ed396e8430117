"""`bulkfetch status DEST`: the journal's state, read without writing and without waiting on
a run that holds it."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bulkfetch.dest.journal import (
    _FAILURES_SQL,
    _TOTALS_SQL,
    DB_NAME,
    STATE_DIR,
    State,
    Totals,
    _check_schema,
    _corrupt,
    _dec,
    _totals,
)
from bulkfetch.dest.lock import LOCK_NAME, lock_holder
from bulkfetch.errors import NoJournal
from bulkfetch.models import Failure
from bulkfetch.runners.live import read_live
from bulkfetch.util.redact import TEXT_LIMIT, safe_text


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
        raise _corrupt(path, f"cannot be read ({exc})") from None
    try:
        if not _check_schema(conn, path):
            return Status(str(dest), "running" if held else "empty", Totals(), pid=pid)
        try:
            totals = _totals(conn.execute(_TOTALS_SQL).fetchone())
            fp_json, last_error = conn.execute(
                "SELECT fingerprint, last_error FROM run").fetchone()
            rows = conn.execute(_FAILURES_SQL, (20,)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise _corrupt(path, f"is damaged ({exc})") from None
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
    failures = tuple(Failure(_dec(n), r, a) for n, r, a in rows)
    live = None
    if held:  # the file of the run holding the lock, not one a killed run left
        found = read_live(dest)
        if found is not None and found.get("pid") == pid and found.get("state") == "running":
            live = found
    return Status(str(dest), state, totals, fingerprint, pid if held else None, last_error,
                  failures, live)


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _quoted(name: str) -> str:
    """A remote name quoted and escaped, cut to TEXT_LIMIT characters (a hostile listing
    can hold names of thousands)."""
    if len(name) <= TEXT_LIMIT:
        return repr(name)
    return f"{name[:TEXT_LIMIT]!r}… ({len(name):,} characters)"


def render_status(status: Status) -> str:
    t = status.totals
    state = status.state + (f" (pid {status.pid})" if status.pid else "")
    lines = [f"{status.dest}: {state}"]
    if "source" in status.fingerprint:
        lines.append(f"source: {status.fingerprint['source']}")
    listing = "complete" if t.listing_done else "not complete"
    lines.append(f"pages: {t.pages_done:,} of {t.pages_listed:,} listed done (listing {listing})")
    # "fetched": a --sync pass counts the files it found unchanged as ok, with no bytes
    lines.append(f"files: {t.files_ok:,} ok, {t.files_failed:,} failed, {t.files_listed:,} "
                 f"listed; {_size(t.bytes)} fetched")
    lines.append(f"started {_when(t.started_at)}, last update {_when(t.updated_at)}")
    if status.live is not None:
        lines += render_live(status.live)
    if status.last_error:
        lines.append(f"last error: {safe_text(status.last_error)}")
    if status.failures:
        lines.append(f"failures (first {len(status.failures)} of {t.files_failed:,}):")
        lines += [f"  {_quoted(f.name)}: {safe_text(f.reason)} ({f.attempts} attempts)"
                  for f in status.failures]
    retry = "rerun with --retry-failed to try the failed files again"
    if len(status.failures) == t.files_failed and all(
            f.refused for f in status.failures):
        retry = ("every failed file was refused before any request, for what the listing "
                 "says of it: a retry would refuse it again")
    hint = {"interrupted": "rerun the same command to resume",
            "finished with failures": retry,
            "empty": "nothing listed yet: rerun the same command to start"}.get(status.state)
    if hint:
        lines.append(hint)
    return "\n".join(lines)


def render_live(live: dict[str, Any]) -> list[str]:
    """A running run's own numbers (status.json): ahead of the journal's, which count a page
    only once all its files are stored."""
    def count(key: str) -> int:
        value = live.get(key)
        return value if isinstance(value, int) else 0

    lines = [f"now: {count('files_ok'):,} ok, {count('files_failed'):,} failed, "
             f"{_size(count('bytes'))}; {float(live.get('files_per_s') or 0):,.0f} files/s, "
             f"{_size(float(live.get('bytes_per_s') or 0))}/s over the last 10 s"]
    limit = count("concurrency")
    lines.append(f"in flight: {count('in_flight'):,}" + (f" (limit {limit:,})" if limit else "")
                 + f", retries {count('retries'):,}; updated "
                 f"{max(0.0, time.time() - float(live.get('updated_at') or 0)):.1f} s ago")
    hosts = live.get("hosts")
    if isinstance(hosts, dict) and len(hosts) > 1:
        shown = sorted(hosts.items(), key=lambda item: -int(item[1]))[:5]
        lines.append("in flight by host: " + ", ".join(f"{h} {n:,}" for h, n in shown))
    reasons = live.get("failures_by_reason")
    if isinstance(reasons, dict) and reasons:
        shown = sorted(reasons.items(), key=lambda item: -int(item[1]))
        lines.append("failed this run: " + ", ".join(f"{r} {n:,}" for r, n in shown))
    if live.get("metrics_url"):
        lines.append(f"metrics: {live['metrics_url']}")
    return lines
