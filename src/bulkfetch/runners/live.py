"""What a running `get` shows the outside: DEST/.bulkfetch/status.json (for `bulkfetch status
DEST --watch/--json`), refreshed every second, and with --metrics the Prometheus endpoint and
DEST/.bulkfetch/metrics.prom (bulkfetch/metrics.py).

The coordinator hands over its Progress and the workers' latest Ticks; a Snapshot is built
from them at most every SNAPSHOT_S and the file written at most every WRITE_S, so the run's
loop pays one clock read per turn. Writing never fails the run: status is a by-product.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bulkfetch.config import GetOptions
from bulkfetch.dest.journal import STATE_DIR
from bulkfetch.dest.status_file import STATUS_NAME, STATUS_VERSION
from bulkfetch.models import LATENCY_BUCKETS, Counts, Failure, Progress, Report, Tick
from bulkfetch.runners.signals import say
from bulkfetch.util.atomic import write_atomically

SNAPSHOT_S = 0.25  # a scrape sees numbers at most this old
WRITE_S = 1.0  # status.json (and metrics.prom) rewritten at most this often
RATE_WINDOW_S = 10.0  # files/s and bytes/s over about this much of the recent past

_HTTP = re.compile(r"^HTTP (\d{3})\b")
_CURL = re.compile(r"\(curl error (\d+)\)")
# libcurl's codes a user recognises by name (the rest stay curl_N)
_CURL_NAMES = {6: "resolve", 7: "connect", 18: "partial_body", 28: "timeout", 35: "tls",
               52: "empty_reply", 55: "send_error", 56: "recv_error", 60: "tls", 63: "too_big"}


def reason_kind(reason: str) -> str:
    """A failure's reason as a short label of bounded variety (for metrics and status):
    http_404, timeout, md5_mismatch, length_mismatch, unsafe_name, ... or other."""
    found = _HTTP.match(reason)
    if found:
        return f"http_{found.group(1)}"
    found = _CURL.search(reason)
    if found:
        code = int(found.group(1))
        return _CURL_NAMES.get(code, f"curl_{code}")
    lowered = reason.lower()
    for needle, kind in (("unsafe name", "unsafe_name"), ("md5", "md5_mismatch"),
                         ("content-length", "length_mismatch"), ("digest", "digest_mismatch"),
                         ("checksum", "digest_mismatch"), ("size", "length_mismatch")):
        if needle in lowered:
            return kind
    return "other"


@dataclass
class Snapshot(Counts):
    """A run's numbers at one moment: what status.json holds and the metrics show.
    Counters are cumulative over the journal (files done by earlier runs count), as the
    Report's are."""

    state: str  # running, finished, finished with failures, interrupted, stopped
    pid: int
    source: str
    started_at: float  # Unix time
    updated_at: float
    elapsed_s: float
    in_flight: int = 0
    partial_bytes: int = 0
    pages_listed: int = 0
    pages_done: int = 0
    listing_done: bool = False
    total_files: int | None = None
    files_per_s: float = 0.0  # over the last RATE_WINDOW_S
    bytes_per_s: float = 0.0
    concurrency: int = 0  # transfers allowed in flight now, all workers
    concurrency_peak: int = 0
    hosts: dict[str, int] = field(default_factory=dict)  # in flight by host (--metrics)
    # transfers allowed in flight by host, all workers (--metrics, --concurrency auto)
    host_limits: dict[str, int] = field(default_factory=dict)
    failures_by_reason: dict[str, int] = field(default_factory=dict)  # this run's
    latency: tuple[int, ...] = ()  # requests by LATENCY_BUCKETS (then +Inf), --metrics
    latency_sum: float = 0.0
    hedged: int = 0  # stragglers asked for again (engine/stragglers.py) ...
    hedges_won: int = 0  # ... and those that answered first
    redialed: int = 0  # connects dialled again
    metrics_url: str | None = None
    error: str | None = None
    version: int = STATUS_VERSION

    def as_json(self) -> dict[str, Any]:
        found = asdict(self)
        found["latency"] = list(self.latency)
        return found


class LiveStatus:
    """The coordinator's window to the outside. update() every loop turn, failed() with each
    journaled page's failures, finish() with the Report."""

    def __init__(self, options: GetOptions, source: str,
                 metrics: Any | None = None) -> None:
        self.path = Path(options.dest) / STATE_DIR / STATUS_NAME
        self.source = source
        self.metrics = metrics  # a metrics.MetricsServer: shown the latest snapshot
        self.started = time.monotonic()
        self.started_at = time.time()
        self.failures: dict[str, int] = {}
        self.recent: deque[tuple[float, int, int]] = deque()  # (monotonic, files, bytes)
        self.snapshot_at = self.written_at = 0.0
        self.snapshot: Snapshot | None = None
        self.write_failed = False

    def failed(self, failures: Iterable[Failure]) -> None:
        for failure in failures:
            kind = reason_kind(failure.reason)
            self.failures[kind] = self.failures.get(kind, 0) + 1

    def update(self, progress: Progress, ticks: Iterable[Tick]) -> None:
        now = time.monotonic()
        if now - self.snapshot_at < SNAPSHOT_S:
            return
        self.snapshot_at = now
        self._publish(self._build(progress, list(ticks), now), now)

    def finish(self, report: Report, progress: Progress, ticks: Iterable[Tick]) -> Snapshot:
        """The last snapshot: the report's counters, written at once."""
        now = time.monotonic()
        if report.interrupted:
            state = "interrupted"
        elif report.error is not None or not report.listing_complete:
            state = "stopped"
        else:
            state = "finished with failures" if report.files_failed else "finished"
        built = self._build(progress, list(ticks), now)
        final = Snapshot(**{
            **asdict(built), "state": state, "files_ok": report.files_ok,
            "files_failed": report.files_failed, "bytes": report.bytes,
            "retries": report.retries, "in_flight": 0, "partial_bytes": 0, "hosts": {},
            "host_limits": {},
            "pages_done": report.pages, "listing_done": report.listing_complete,
            "concurrency": report.concurrency_final,
            "concurrency_peak": report.concurrency_peak, "error": report.error})
        self._publish(final, now, force=True)
        return final

    def _build(self, progress: Progress, ticks: list[Tick], now: float) -> Snapshot:
        files_done = progress.files_ok + progress.files_failed
        self.recent.append((now, files_done, progress.moving_bytes))
        while len(self.recent) > 2 and now - self.recent[1][0] >= RATE_WINDOW_S:
            self.recent.popleft()
        then, files_then, bytes_then = self.recent[0]
        span = now - then
        hosts: dict[str, int] = {}
        host_limits: dict[str, int] = {}
        latency = [0] * (len(LATENCY_BUCKETS) + 1)
        latency_sum = 0.0
        for tick in ticks:
            for host, count in tick.hosts:
                hosts[host] = hosts.get(host, 0) + count
            for host, limit in tick.host_limits:
                host_limits[host] = host_limits.get(host, 0) + limit
            if tick.latency:
                latency = [a + b for a, b in zip(latency, tick.latency, strict=True)]
                latency_sum += tick.latency_sum
        return Snapshot(
            state="running", pid=os.getpid(), source=self.source,
            started_at=self.started_at, updated_at=time.time(),
            elapsed_s=round(now - self.started, 3),
            files_ok=progress.files_ok, files_failed=progress.files_failed,
            bytes=progress.bytes, retries=progress.retries, in_flight=progress.in_flight,
            partial_bytes=progress.partial_bytes, pages_listed=progress.pages_listed,
            pages_done=progress.pages_done, listing_done=progress.listing_done,
            total_files=progress.total_files,
            files_per_s=round((files_done - files_then) / span, 1) if span > 0 else 0.0,
            bytes_per_s=round((progress.moving_bytes - bytes_then) / span, 1)
            if span > 0 else 0.0,
            concurrency=sum(t.limit for t in ticks),
            concurrency_peak=sum(t.peak_limit for t in ticks),
            hosts=hosts, host_limits=host_limits, failures_by_reason=dict(self.failures),
            latency=tuple(latency) if any(t.latency for t in ticks) else (),
            latency_sum=latency_sum,
            hedged=sum(t.hedged for t in ticks), hedges_won=sum(t.hedges_won for t in ticks),
            redialed=sum(t.redialed for t in ticks),
            metrics_url=self.metrics.url if self.metrics is not None else None)

    def _publish(self, snapshot: Snapshot, now: float, force: bool = False) -> None:
        self.snapshot = snapshot
        if self.metrics is not None:
            self.metrics.show(snapshot)
        if force or now - self.written_at >= WRITE_S:
            self.written_at = now
            self._write(snapshot)

    def _write(self, snapshot: Snapshot) -> None:
        try:
            write_atomically(self.path, json.dumps(snapshot.as_json(), indent=1) + "\n")
            if self.metrics is not None:
                self.metrics.write_file(self.path.parent)
        except OSError as exc:
            if not self.write_failed:  # said once; the run goes on without it
                self.write_failed = True
                say(f"bulkfetch: cannot write {self.path} ({exc.strerror}); `bulkfetch "
                    "status` will not show live numbers\n")

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
