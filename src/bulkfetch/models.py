"""Small, picklable values that cross process boundaries, and the final Report.

Pages go down to workers; PageReports and Ticks come up. Nothing per file crosses a process
boundary except inside a page's failure list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Page:
    """One page of names to fetch. `token` is what listed it (None: the first page).
    `sizes` and `md5s`, when the listing stated them (S3), are each item's size and the hex
    MD5 its ETag gives ("" for an ETag that is no MD5: an object uploaded in parts).
    `headers`, a cache's page (a Client's cache_dir): each item's extra request header
    lines joined by "\n" ("" for none: If-None-Match, If-Modified-Since), and the sink sees
    the answers' headers and their 304s (fetcher.py: _completed_cached). None otherwise."""

    seq: int
    token: str | None
    names: tuple[str, ...]
    sizes: tuple[int, ...] | None = None
    md5s: tuple[str, ...] | None = None
    headers: tuple[str, ...] | None = None

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # On the wire the names travel as one NUL-joined string: pickling a thousand
        # strings one by one (each memoized) cost more than the rest of the page's trip.
        # A name holding a NUL itself (hostile, but JSON allows it) keeps the tuple. The
        # MD5s (hex or "", never a NUL) travel the same way.
        joined = "\0".join(self.names)
        names: str | tuple[str, ...] = self.names
        if joined.count("\0") == len(self.names) - 1 and self.names:
            names = joined
        md5s = "\0".join(self.md5s) if self.md5s else self.md5s
        if self.headers is None:  # the usual page: as short on the wire as before
            return _page_from_wire, (self.seq, self.token, names, self.sizes, md5s)
        headers: str | tuple[str, ...] = self.headers
        joined = "\0".join(self.headers)
        if self.headers and joined.count("\0") == len(self.headers) - 1:
            headers = joined
        return _page_from_wire, (self.seq, self.token, names, self.sizes, md5s, headers)


def _page_from_wire(seq: int, token: str | None, names: str | tuple[str, ...],
                    sizes: tuple[int, ...] | None = None,
                    md5s: str | tuple[str, ...] | None = None,
                    headers: str | tuple[str, ...] | None = None) -> Page:
    return Page(seq, token, tuple(names.split("\0")) if isinstance(names, str) else names,
                sizes, tuple(md5s.split("\0")) if isinstance(md5s, str) else md5s,
                tuple(headers.split("\0")) if isinstance(headers, str) else headers)


@dataclass(frozen=True, slots=True)
class Failure:
    name: str
    reason: str
    attempts: int
    url: str = ""  # what was asked for ("" when the item never became a URL)

    @property
    def refused(self) -> bool:
        """Refused before any request, for what the listing says of it (an unsafe name, no
        usable URL): a retry of the same listing refuses it again."""
        return self.attempts == 0


@dataclass(frozen=True, slots=True)
class PageReport:
    """A page is finished: every name is either durable in the sink or a Failure."""

    seq: int
    ok: int
    bytes: int
    failures: tuple[Failure, ...] = ()


# A big file in flight: (name, bytes so far, total bytes or -1 when the server said none).
InFlight = tuple[str, int, int]
SHOWN_IN_FLIGHT = 5  # big files in flight a tick names, and the display shows


# Upper bounds (seconds) of the request latency histogram's buckets (Prometheus' `le`); a
# worker counts each request in the first bucket whose bound is at or above its time, the
# last count being the +Inf bucket. Only kept with --metrics: it costs a getinfo per file.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def largest_first(entry: InFlight) -> tuple[int, str]:
    """Sort key: the largest file (by total, or by bytes so far) first."""
    return -max(entry[1], entry[2]), entry[0]


@dataclass(slots=True, kw_only=True)
class Counts:
    """What every level of a run counts, declared once: a worker's Tick, the coordinator's
    Progress, the live status (runners/live.py) and the Report are each Counts and more.
    Keyword-only, so each keeps its own first fields (Tick's worker, Report's source). Not
    frozen: a Report is the caller's to change."""

    files_ok: int = 0
    files_failed: int = 0
    bytes: int = 0
    retries: int = 0
    # Of `bytes`, what partial files a stopped run left already held (a big file resumed
    # byte by byte): stored by this run, not moved by it, so no rate counts them.
    continued_bytes: int = 0

    @staticmethod
    def total(many: Iterable[Counts]) -> Counts:
        """The counters summed over `many` (the workers' latest ticks)."""
        files_ok = files_failed = nbytes = retries = continued = 0
        for counts in many:
            files_ok += counts.files_ok
            files_failed += counts.files_failed
            nbytes += counts.bytes
            retries += counts.retries
            continued += counts.continued_bytes
        return Counts(files_ok=files_ok, files_failed=files_failed, bytes=nbytes,
                      retries=retries, continued_bytes=continued)


@dataclass(slots=True)
class Tick(Counts):
    """A worker's cumulative counters, sent about every 100 ms."""

    worker: int
    in_flight: int = 0
    partial_bytes: int = 0  # bytes of the big bodies in flight (not yet in `bytes`)
    largest: tuple[InFlight, ...] = ()  # the worker's largest big files in flight
    ranged_restarts: int = 0  # files split into ranges that started over as one stream
    size_only: int = 0  # files split into ranges with no whole-file digest stated
    checked: tuple[int, int, int] = (0, 0, 0)  # stored by an MD5, another digest, size alone
    limit: int = 0  # transfers the worker may have in flight now (--concurrency auto moves it)
    peak_limit: int = 0  # ... the highest it has been
    # With --metrics: requests by latency bucket (LATENCY_BUCKETS, then +Inf), their summed
    # seconds, and the transfers in flight by host.
    latency: tuple[int, ...] = ()
    latency_sum: float = 0.0
    hosts: tuple[tuple[str, int], ...] = ()
    # ... and under --concurrency auto, each of those hosts' limit in this worker
    host_limits: tuple[tuple[str, int], ...] = ()
    not_modified: int = 0  # conditional requests answered 304 (get --sync, a Client cache)
    same_bodies: int = 0  # ... answered 200 with the body DEST held (left as it was)
    # ticks at which transfers waited for the worker's share of --limit-rate or --max-rps
    # (or a host's pause): the coordinator gives such a worker more (rate_shares.py)
    held_ticks: int = 0
    # stragglers (engine/stragglers.py): asked for again on another connection, and how
    # many of those answered first; connects dialled again; transfers given back to the
    # queue when a limit fell
    hedged: int = 0
    hedges_won: int = 0
    redialed: int = 0
    requeued: int = 0
    # --concurrency auto: what the worker learned of its hosts (host, limit, lowest latency
    # or 0.0), the highest limits first, a few at most; kept for a resumed run
    # (dest/host_memory.py)
    learned: tuple[tuple[str, int, float], ...] = ()


@dataclass
class Progress(Counts):
    """Everything a display needs at one moment (cumulative since the run began)."""

    in_flight: int = 0
    pages_listed: int = 0
    pages_done: int = 0
    listing_done: bool = False
    total_files: int | None = None  # from X-Total-Files or once listing has finished
    elapsed_s: float = 0.0
    resumed_files: int = 0  # done in earlier runs of the same journal (not in the rates)
    resumed_bytes: int = 0  # their bytes (included in `bytes`, not in the rates)
    partial_bytes: int = 0  # bytes of the big bodies in flight, not yet stored
    largest: tuple[InFlight, ...] = ()  # the largest big files in flight, largest first

    @property
    def moving_bytes(self) -> int:
        """Bytes stored plus bytes of big bodies on their way, less what a stopped run's
        partial files held: what byte rates count (it never jumps as a file is stored)."""
        return self.bytes - self.continued_bytes + self.partial_bytes

    @property
    def moved_now(self) -> int:
        """Bytes this run moved, stored or on their way (not by earlier runs of the same
        journal): over the run's time, the Report's bytes_per_s."""
        return max(self.moving_bytes - self.resumed_bytes, 0)


@dataclass
class Report(Counts):
    """The outcome of a run: what `--report FILE.json` holds and download() returns."""

    source: str
    dest: str
    pages: int = 0
    pages_listed: int = 0  # pages listed, done or not (a stopped run: the rest under way)
    # Big files fetched in ranges: how many the server's answers made start over as one
    # stream, and how many were checked by size alone (no whole-file digest was stated).
    ranged_restarts: int = 0
    ranged_size_only: int = 0
    # This run's stored files by how each was checked: an MD5 the server stated (ETag,
    # Content-MD5), another digest it stated (S3's stored checksum, Repr-Digest), or the
    # length alone (the server stated no digest, or --no-verify).
    checked_md5: int = 0
    checked_digest: int = 0
    checked_size: int = 0
    # Files a directory listing gave only a rounded size ('12K'): the answer's own length
    # checked them, not the listing
    sizes_estimated: int = 0
    duration_s: float = 0.0
    listing_complete: bool = False
    interrupted: bool = False
    error: str | None = None  # a run-level error (listing failed, disk full ...)
    usage_error: bool = False  # `error` is the user's to fix (bad credentials): exit 2
    resumed_files: int = 0
    resumed_bytes: int = 0
    # What DEST/.bulkfetch/partial keeps when the run ends: big files fetched in part, which
    # the rerun continues from these bytes (engine/resume.py)
    partial_files: int = 0
    partial_bytes: int = 0
    # Transfers in flight allowed at the end and at most, summed over the workers: what
    # --concurrency auto found (a fixed --concurrency: that times the workers)
    concurrency_final: int = 0
    concurrency_peak: int = 0
    options: dict[str, object] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)  # the first 1,000
    failures_file: str | None = None  # DEST/.bulkfetch/failures.jsonl: every failure
    # Per worker: {"worker", "node", "files_ok", "files_failed", "bytes", "lost": why|None}
    workers: list[dict[str, object]] = field(default_factory=list)
    # Pages a lost worker (a Ray actor or node that died) held, fetched again by the others
    pages_reassigned: int = 0
    leases_lapsed: int = 0  # of the workers lost, those silent past --lease
    # Stragglers (see Tick)
    hedged: int = 0
    hedges_won: int = 0
    redialed: int = 0
    requeued: int = 0
    # get --sync: files found in step with the source without a body (the listing's size and
    # MD5, or a 304), and files removed by --delete as no longer listed
    unchanged: int = 0
    unchanged_listed: int = 0  # of `unchanged`, those the listing showed
    unchanged_same_body: int = 0  # ... those answered 200 with DEST's bytes (the rest: 304s)
    deleted: int = 0
    changed_in_dest: int = 0  # files modified in DEST since they were stored: fetched again
    started_at: float | None = None  # Unix time (time.time()) the run began
    finished_at: float | None = None  # Unix time the run ended

    @property
    def files_per_s(self) -> float:
        """This run's rate: files done by earlier runs of the same journal do not count."""
        done_now = self.files_ok - self.resumed_files
        return done_now / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        done_now = self.bytes - self.resumed_bytes - self.continued_bytes
        return done_now / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def exit_code(self) -> int:
        """0 all done, 1 some files failed or the run could not finish, 2 it stopped on what
        the user must change, 130 interrupted."""
        if self.usage_error:
            return 2
        if self.interrupted:
            return 130
        if self.error is not None or self.files_failed or not self.listing_complete:
            return 1
        return 0
