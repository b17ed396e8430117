"""Frozen configuration of a download run: what to fetch, how hard, how patiently."""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from bulkfetch.errors import UsageError
from bulkfetch.models import SHOWN_IN_FLIGHT

if TYPE_CHECKING:
    from bulkfetch.sources.oci import BlobPlan


@dataclass(frozen=True)
class SourceShape:
    """The shape of a paginated JSON listing API (the seed API by default)."""

    list_path: str = "/list"
    names_key: str = "FileNames"
    next_key: str = "NextMarker"
    marker_param: str = "next-marker"
    get_template: str = "/get/{name}"

    def __post_init__(self) -> None:
        if "{name}" not in self.get_template:
            raise UsageError(f"--get-template {self.get_template!r} must contain {{name}}")


# A list page is held whole in memory and parsed; 16 MiB is about a million names, far
# above any real API's page, and keeps a hostile page of 10^7 names from exhausting memory.
DEFAULT_MAX_PAGE_SIZE = 16 << 20


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter; Retry-After honoured up to max_retry_wait_s."""

    retries: int = 8  # attempts after the first one
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 20.0
    max_retry_wait_s: float = 60.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise UsageError(f"--retries must be >= 0, got {self.retries}")
        if self.max_retry_wait_s < 0:
            raise UsageError("--max-retry-wait must be >= 0 seconds")

    def delay(self, attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number `attempt` (1 = the first retry)."""
        if retry_after_s is not None:
            return min(max(retry_after_s, 0.0), self.max_retry_wait_s)
        ceiling = min(self.backoff_cap_s, self.backoff_base_s * 2 ** (attempt - 1))
        return rng.uniform(0.0, ceiling)


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 10.0
    idle_s: float = 30.0  # slower than min_speed for this long: give up on the attempt
    total_s: float | None = None  # per request, optional
    # Bytes/s below which a transfer counts as idle. Low enough for a slow link shared by
    # every transfer in flight, high enough that a hostile 1-byte-per-second trickle fails.
    min_speed: int = 100

    def __post_init__(self) -> None:
        if self.connect_s <= 0 or self.idle_s <= 0 or (self.total_s is not None
                                                       and self.total_s <= 0):
            raise UsageError("timeouts must be positive numbers of seconds")
        if self.min_speed < 1:
            raise UsageError(f"--min-speed must be >= 1 byte/s, got {self.min_speed}")


@dataclass(frozen=True)
class Limits:
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    concurrency: int = 64  # transfers in flight per worker (adaptive: the first limit)
    # --concurrency auto: engine/adaptive.py moves the limit, up to max_concurrency
    adaptive: bool = False
    max_concurrency: int = 4096
    # Pages listed but not finished; 0 = 8 per worker + 2. A page stays out until its
    # slowest file ends, and under faults most pages wait seconds on a retry or a timeout:
    # a window of a few pages per worker would leave the transfers idle meanwhile.
    pages_ahead: int = 0
    per_host: int = 0  # connections per host per worker; 0 = no limit beyond concurrency
    max_rps: float = 0.0  # requests started per second per host, whole run; 0: no limit
    limit_rate: int = 0  # body bytes per second per host, whole run; 0: no limit
    max_page_size: int = DEFAULT_MAX_PAGE_SIZE  # bytes of one list page
    # Bodies larger than this stream into the sink's spool as they arrive; smaller ones are
    # collected in memory (the fast path). 0: every body streams.
    spool_above: int = 1 << 20
    # A body of at least split_above bytes, from a server that serves ranges, is fetched in
    # pieces over `parts` connections (engine/parts.py).
    split_above: int = 64 << 20
    parts: int = 8

    def __post_init__(self) -> None:
        if self.workers < 1 or self.concurrency < 1:
            raise UsageError("--workers and --concurrency must be >= 1")
        if self.max_page_size < 1:
            raise UsageError("--max-page-size must be >= 1 byte")
        if self.max_concurrency < 1:
            raise UsageError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if self.limit_rate < 0:
            raise UsageError(f"--limit-rate must be >= 0 bytes/s, got {self.limit_rate}")
        if self.max_rps < 0:
            raise UsageError(f"--max-rps must be >= 0, got {self.max_rps}")
        if self.parts < 1:
            raise UsageError(f"--parts must be >= 1, got {self.parts}")
        if self.split_above < 1:
            raise UsageError(f"--split-above must be >= 1 byte, got {self.split_above}")
        if self.spool_above < 0:
            raise UsageError(f"--spool-above must be >= 0 bytes, got {self.spool_above}")

    @property
    def max_pages_out(self) -> int:
        return self.pages_ahead or 8 * self.workers + 2


@dataclass(frozen=True)
class SyncOptions:
    """get --sync (bulkfetch/sync.py): list again, fetch only what is new or changed."""

    sync: bool = False
    delete: bool = False  # remove the files under DEST the pass did not list
    dry_run: bool = False  # list, and say what --delete would remove; fetch nothing

    def __post_init__(self) -> None:
        if (self.delete or self.dry_run) and not self.sync:
            raise UsageError("--delete and --dry-run go with --sync")


@dataclass(frozen=True)
class SinkOptions:
    kind: str = "dir"  # "dir" | "tar" | "null"; "stream", "stream-each": bulkfetch.stream
    fanout: int = 0  # dir: levels of hash-prefix directories
    shard_files: int = 100_000  # tar: a shard takes no new page once it holds this many
    shard_size: int = 1 << 30  # tar: ... or this many bytes
    fsync: bool = False  # dir: each file's data on disk before it is renamed into place

    def __post_init__(self) -> None:
        if self.kind not in ("dir", "tar", "null", "stream", "stream-each"):
            raise UsageError(f"--sink {self.kind!r}: choose dir, tar or null")
        if not 0 <= self.fanout <= 4:
            raise UsageError(f"--fanout must be 0..4, got {self.fanout}")
        if self.fanout and self.kind != "dir":
            raise UsageError("--fanout applies to --sink dir only (tar shards hold any "
                             "number of names)")
        if self.shard_files < 1 or self.shard_size < 1:
            raise UsageError("--shard-files and --shard-size must be >= 1")

    def layout(self) -> dict[str, object]:
        """What decides where a file lands; shard sizes may change between runs."""
        return {"kind": self.kind, "fanout": self.fanout}


@dataclass(frozen=True)
class TableOptions:
    """How rows of a URL table (--from-file .csv/.tsv/.jsonl/.parquet) become files."""

    url_col: str = "url"
    name_col: str | None = None
    name_template: str | None = None  # with {index} (row, from 0) and {ext} (the URL's)
    save_cols: tuple[str, ...] = ()  # columns stored as each row's <key>.json

    def __post_init__(self) -> None:
        if len(set(self.save_cols)) != len(self.save_cols):
            raise UsageError(f"--save-cols {','.join(self.save_cols)!r} names a column twice")
        if self.name_col is not None and self.name_template is not None:
            raise UsageError("give --name-col or --name-template, not both")
        if self.name_template is not None:
            try:
                self.name_template.format(index=0, ext=".jpg")
            except (KeyError, IndexError, ValueError) as exc:
                raise UsageError(
                    f"--name-template {self.name_template!r}: {exc!r}; it may use {{index}} "
                    "(the row, from 0, e.g. {index:09d}) and {ext} (the URL's extension)"
                ) from None


@dataclass(frozen=True)
class S3Options:
    """How an s3:// source is reached and which keys it takes. Flags only: credentials are
    resolved from the environment and ~/.aws where they are used (s3/settings.py), so no
    secret is ever part of the options a report or journal holds."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    no_sign_request: bool = False
    addressing: str = "auto"  # "auto" | "path" | "virtual"
    include: tuple[str, ...] = ()  # globs on names (keys relative to the prefix)
    exclude: tuple[str, ...] = ()
    list_concurrency: int = 32  # listing requests in flight (key ranges listed at once)

    def __post_init__(self) -> None:
        if self.list_concurrency < 1:
            raise UsageError(f"--list-concurrency must be >= 1, got {self.list_concurrency}")
        if self.addressing not in ("auto", "path", "virtual"):
            raise UsageError(f"--addressing-style {self.addressing!r}: give auto, path or "
                             "virtual")

    def listing(self) -> dict[str, object]:
        """What decides which keys a run lists (its fingerprint): not how it signs."""
        return {"endpoint_url": self.endpoint_url, "include": list(self.include),
                "exclude": list(self.exclude)}


@dataclass(frozen=True)
class TlsOptions:
    """Whom https:// trusts, for every libcurl handle of a run (engine/curl.py). Built by
    tls.resolve_tls(): --ca-bundle, else the first of REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE,
    SSL_CERT_FILE that is set, else libcurl's own CA store."""

    ca_bundle: str | None = None  # a PEM file, or a directory prepared by `openssl rehash`
    insecure: bool = False  # no peer or host name verification (--insecure)
    origin: str = ""  # where ca_bundle came from, for messages: "--ca-bundle", a variable

    def __post_init__(self) -> None:
        if self.insecure and self.ca_bundle is not None:
            raise UsageError("give --ca-bundle or --insecure, not both")


RUNNERS = ("local", "ray")


@dataclass(frozen=True)
class RunnerOptions:
    """Where the workers run: processes on this machine, or Ray actors on a cluster (not in
    fingerprint(): a run started on one resumes on the other)."""

    kind: str = "local"
    ray_address: str | None = None  # "auto", HOST:PORT, ray://...; None: RAY_ADDRESS or new
    workers_given: bool = False  # --workers given: caps the actors (else one per CPU)

    def __post_init__(self) -> None:
        if self.kind not in RUNNERS:
            raise UsageError(f"--runner {self.kind!r}: choose one of {', '.join(RUNNERS)}")
        if self.ray_address is not None and self.kind != "ray":
            raise UsageError("--ray-address is for --runner ray")


@dataclass(frozen=True)
class GetOptions:
    source: str  # the listing API's base URL, or the path of a URL list (from_file)
    dest: str
    from_file: bool = False
    shape: SourceShape = field(default_factory=SourceShape)
    limits: Limits = field(default_factory=Limits)
    sink: SinkOptions = field(default_factory=SinkOptions)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    verify: bool = True
    restart: bool = False
    retry_failed: bool = False
    sync: SyncOptions = field(default_factory=SyncOptions)  # not in fingerprint(): a mode
    table: TableOptions = field(default_factory=TableOptions)
    s3: S3Options = field(default_factory=S3Options)
    # Not in fingerprint(): trust decides how the run connects, not what it lists or where
    # files land, so a renewed or moved CA bundle (or a first run that failed on the
    # certificate, rerun with --ca-bundle) resumes instead of asking for --restart.
    tls: TlsOptions = field(default_factory=TlsOptions)
    # --metrics HOST:PORT: Prometheus text served there, and the workers keep the latency
    # histogram and in-flight counts by host that it shows (not in fingerprint() either).
    metrics: str | None = None
    # `bulkfetch pull`: the blobs its manifests name (the source then is this plan). Such a
    # run starts a new journal every time (the pull itself finds what is missing) and keeps
    # the partial files, which are named by content.
    blobs: BlobPlan | None = None
    shown_in_flight: int = SHOWN_IN_FLIGHT  # big files in flight a tick names (display rows)
    runner: RunnerOptions = field(default_factory=RunnerOptions)

    def fingerprint(self) -> dict[str, object]:
        """What makes two runs 'the same run' for resuming: source and output layout."""
        found = {
            "source": self.source,
            "from_file": self.from_file,
            "shape": asdict(self.shape),
            "sink": self.sink.layout(),
        }
        if self.from_file and self.source.lower().endswith((".csv", ".tsv", ".jsonl",
                                                             ".parquet")):
            # resuming by row offset is right only in the same table, read the same way
            table = asdict(self.table)
            if not table["save_cols"]:  # as journaled before --save-cols existed
                del table["save_cols"]
            found |= {"table": table, "table_identity": table_identity(self.source)}
        if self.source.startswith("s3://") and not self.from_file:
            found["s3"] = self.s3.listing()
        return found

    def as_dict(self) -> dict[str, object]:
        if self.blobs is None:
            return asdict(self)
        from dataclasses import replace

        # a pull's plan holds credentials and tokens: a report shows only its size
        return asdict(replace(self, blobs=None)) | {"blobs": self.blobs.summary()}


def table_identity(path: str) -> list[object]:
    """(size, mtime in ns, SHA-256 of the first MiB) of a URL table, or [] when unreadable
    (the source then says why)."""
    import hashlib

    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            head = hashlib.sha256(handle.read(1 << 20)).hexdigest()
    except OSError:
        return []
    return [stat.st_size, stat.st_mtime_ns, head]
