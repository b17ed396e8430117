"""Frozen configuration of a download run: what to fetch, how hard, how patiently."""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from typing import Protocol

from bulkfetch.errors import UsageError
from bulkfetch.models import SHOWN_IN_FLIGHT


class SourcePlan(Protocol):
    """A source the caller hands over whole instead of a URL to list (`bulkfetch pull`: the
    blobs its manifests name). The source kind registered under `kind` reads it
    (sources/registry.py). A run of a plan starts a new journal every time: the caller
    decides what is still missing."""

    @property
    def kind(self) -> str:
        """The registered source kind that reads this plan."""
        ...

    def identity(self) -> str:
        """What the run's fingerprint records as its source: what is fetched, not how."""
        ...

    def summary(self) -> dict[str, object]:
        """For reports: sizes and counts, never credentials or tokens."""
        ...


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


PAGINATION_STYLES = ("token", "url", "link", "offset", "page", "none")


@dataclass(frozen=True)
class ApiShape:
    """A JSON listing API's shape beyond the seed API's (sources/jsonapi.py): JMESPath
    expressions into each page and its items, and how the next page is asked for. Every
    field is part of the journal's fingerprint: a run resumed under another shape would
    read its journaled tokens the wrong way."""

    items: str = "@"  # the page's list of items; "@": the page itself is the list
    name: str = "@"  # an item's name; "@": the item is its name (a list of strings)
    size: str | None = None  # an item's size in bytes (a number or a decimal string)
    md5: str | None = None  # an item's MD5, hex or base64 (GCS's md5Hash)
    sha256: str | None = None  # an item's SHA-256, hex, base64 or "sha256:<hex>"
    url: str | None = None  # an item's own URL (relative to the page); else get_template
    total: str | None = None  # the whole listing's number of files (DRF's count)
    paginate: str = "token"  # one of PAGINATION_STYLES
    next: str | None = None  # token: the next page's token; url: the next page's URL
    next_param: str | None = None  # token: the query parameter that carries it
    page_param: str | None = None  # offset / page: the parameter holding offset or number
    limit_param: str | None = None  # offset / page: the parameter holding the page size
    page_size: int | None = None  # items asked for per page (offset needs it)
    first_page: int | None = None  # page: the first page's number (1); offset: 0
    allow_cross_host_pages: bool = False  # url / link: a next page on another host is fine

    def __post_init__(self) -> None:
        if self.paginate not in PAGINATION_STYLES:
            raise UsageError(f"--paginate {self.paginate!r}: choose one of "
                             f"{', '.join(PAGINATION_STYLES)}")
        if self.paginate == "token" and (not self.next or not self.next_param):
            raise UsageError("--paginate token needs --next PATH (where the page holds the "
                             "next token) and --next-param NAME (the query parameter that "
                             "carries it)")
        if self.paginate == "url" and not self.next:
            raise UsageError("--paginate url needs --next PATH: where the page holds the next "
                             "page's URL")
        if self.paginate in ("offset", "page") and not self.page_param:
            raise UsageError(f"--paginate {self.paginate} needs --page-param NAME: the query "
                             f"parameter holding the {self.paginate}")
        if self.paginate == "offset" and not self.page_size:
            raise UsageError("--paginate offset needs --page-size N: how far each page moves "
                             "the offset")
        if self.page_size is not None and self.page_size < 1:
            raise UsageError(f"--page-size must be >= 1, got {self.page_size}")
        if self.limit_param and not self.page_size:
            raise UsageError("--limit-param needs --page-size N: the value it carries")


@dataclass(frozen=True)
class RequestAuth:
    """Headers sent with listing and file requests (--header, --header-file, --bearer-env)
    and libcurl's --netrc. The values are secrets: they never reach repr(), a report, the
    journal or status.json (summary() names the headers only), and sources send them only
    to the listing's and the files' hosts (sources/headers.py)."""

    headers: tuple[tuple[str, str], ...] = ()  # (name, value), in the order given
    netrc: bool = False
    origins: tuple[str, ...] = ()  # where they came from, for reports: "--bearer-env VAR"

    def __repr__(self) -> str:
        return f"RequestAuth({self.summary()!r})"

    def summary(self) -> dict[str, object]:
        """What a report may show: header names, never values."""
        return {"headers": [name for name, _ in self.headers], "netrc": self.netrc,
                "from": list(self.origins)}


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
    # What --concurrency auto learned of hosts in a former run into DEST, to start near it:
    # (host, limit per worker, lowest latency in seconds or 0.0), dest/host_memory.py
    remembered: tuple[tuple[str, int, float], ...] = ()

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
class DeleteLimit:
    """--max-delete N or P%: the most files --delete may remove in one pass, as a number or
    as a share of the files DEST holds. Above it nothing at all is removed: a listing cut
    short by a server's mistake looks, to a sync, like a source that lost its files."""

    count: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, text: str) -> DeleteLimit:
        given = text.strip()
        try:
            if given.endswith("%"):
                percent = float(given[:-1])
                if not 0 <= percent <= 100:
                    raise ValueError
                return cls(percent=percent)
            count = int(given.replace(",", "").replace("_", ""))
            if count < 0:
                raise ValueError
            return cls(count=count)
        except ValueError:
            raise UsageError(f"--max-delete {text!r}: give a number of files (e.g. 1000) or "
                             "a share of the files in DEST (e.g. 5%)") from None

    def allows(self, removing: int, held: int) -> bool:
        if self.count is not None:
            return removing <= self.count
        if self.percent is not None:
            return removing * 100 <= self.percent * held
        return True

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else f"{self.count}"


@dataclass(frozen=True)
class SyncOptions:
    """get --sync (bulkfetch/sync.py): list again, fetch only what is new or changed."""

    sync: bool = False
    delete: bool = False  # remove the files under DEST the pass did not list
    dry_run: bool = False  # list, and say what --delete would remove; fetch nothing
    max_delete: DeleteLimit | None = None  # above it, --delete removes nothing
    # unchanged only by content: the listing's MD5, a 304 to the MD5, or the body compared
    checksum: bool = False

    def __post_init__(self) -> None:
        if self.checksum and not self.sync:
            raise UsageError("--checksum judges what --sync keeps: add --sync")
        if (self.delete or self.dry_run) and not self.sync:
            raise UsageError("--delete and --dry-run go with --sync")
        if self.max_delete is not None and not (self.delete or self.dry_run):
            raise UsageError("--max-delete limits --delete (or what --dry-run says it "
                             "would do): add --sync --delete")


SHARD_FILES, SHARD_SIZE = 100_000, 1 << 30  # a tar shard's default limits


@dataclass(frozen=True)
class SinkOptions:
    kind: str = "dir"  # "dir" | "tar" | "null"; "stream", "stream-each": bulkfetch.stream
    fanout: int = 0  # dir: levels of hash-prefix directories
    shard_files: int = SHARD_FILES  # tar: a shard takes no new page once it holds this many
    shard_size: int = SHARD_SIZE  # tar: ... or this many bytes
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
        if self.kind != "tar" and (self.shard_files, self.shard_size) != (SHARD_FILES,
                                                                          SHARD_SIZE):
            raise UsageError(f"--shard-files and --shard-size apply to --sink tar, not "
                             f"--sink {self.kind}")

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
class CrawlOptions:
    """A web server's directory tree (sources/crawl.py): how deep it is crawled and which
    files it takes. All of it is in fingerprint(): it decides what the run lists."""

    max_depth: int | None = None  # levels below the start URL listed (0: its files only)
    include: tuple[str, ...] = ()  # globs on paths relative to the start URL
    exclude: tuple[str, ...] = ()
    list_concurrency: int = 8  # directory listings in flight at once (a small server: few)

    def __post_init__(self) -> None:
        if self.max_depth is not None and self.max_depth < 0:
            raise UsageError(f"--max-depth must be >= 0, got {self.max_depth}")
        if self.list_concurrency < 1:
            raise UsageError(f"--list-concurrency must be >= 1, got {self.list_concurrency}")

    def listing(self) -> dict[str, object]:
        return {"max_depth": self.max_depth, "include": list(self.include),
                "exclude": list(self.exclude)}


@dataclass(frozen=True)
class TlsOptions:
    """Whom https:// trusts, for every libcurl handle of a run (net/curl.py). Built by
    tls.resolve_tls(): --ca-bundle, else the first of REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE,
    SSL_CERT_FILE that is set, else libcurl's own CA store."""

    ca_bundle: str | None = None  # a PEM file, or a directory prepared by `openssl rehash`
    insecure: bool = False  # no peer or host name verification (--insecure)
    origin: str = ""  # where ca_bundle came from, for messages: "--ca-bundle", a variable

    def __post_init__(self) -> None:
        if self.insecure and self.ca_bundle is not None:
            raise UsageError("give --ca-bundle or --insecure, not both")


RUNNERS = ("local", "ray")
LEASE_S = 30.0  # --lease: tens of seconds, far above a worker's healthy tenth-of-a-second ticks
MIN_LEASE_S = 2.0


@dataclass(frozen=True)
class RunnerOptions:
    """Where the workers run: processes on this machine, or Ray actors on a cluster (not in
    fingerprint(): a run started on one resumes on the other)."""

    kind: str = "local"
    ray_address: str | None = None  # "auto", HOST:PORT, ray://...; None: RAY_ADDRESS or new
    workers_given: bool = False  # --workers given: caps the actors (else one per CPU)
    # a worker or actor silent this long loses its pages (runners/holdings.py)
    lease_s: float = LEASE_S

    def __post_init__(self) -> None:
        if self.kind not in RUNNERS:
            raise UsageError(f"--runner {self.kind!r}: choose one of {', '.join(RUNNERS)}")
        if self.ray_address is not None and self.kind != "ray":
            raise UsageError("--ray-address is for --runner ray")
        if not self.lease_s >= MIN_LEASE_S:
            raise UsageError(f"--lease must be at least {MIN_LEASE_S:g} seconds (a worker "
                             "says something about ten times a second when healthy, an "
                             "actor about twice)")


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
    # A source given whole (`bulkfetch pull`: the blobs its manifests name); the run's
    # source is then the plan, read by its registered kind (sources/registry.py). Such a
    # run starts a new journal every time (the pull itself finds what is missing) and keeps
    # the partial files, which are named by content.
    plan: SourcePlan | None = None
    shown_in_flight: int = SHOWN_IN_FLIGHT  # big files in flight a tick names (display rows)
    runner: RunnerOptions = field(default_factory=RunnerOptions)
    # A JSON listing API of another shape than the seed API's (None: the seed API's fast
    # path, FileServerSource); part of fingerprint().
    api: ApiShape | None = None
    # Request headers and --netrc: not in fingerprint() (how a run authenticates, not what
    # it lists; a renewed token resumes), and masked in as_dict().
    auth: RequestAuth = field(default_factory=RequestAuth)
    # A web server's directory tree, crawled (`--api index`, or a URL ending in '/' that
    # answers a directory listing); None for every other source. Part of fingerprint().
    crawl: CrawlOptions | None = None

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
        if self.api is not None:  # only then: the seed API's runs keep their fingerprint
            found["api"] = asdict(self.api)
        if self.crawl is not None:
            found["crawl"] = self.crawl.listing()
        return found

    def as_dict(self) -> dict[str, object]:
        from dataclasses import replace

        # Header values are secrets: a report shows their names. A pull's plan holds
        # credentials and tokens: a report shows only its size.
        found = asdict(replace(self, plan=None, auth=RequestAuth()))
        found["auth"] = self.auth.summary()
        if self.plan is not None:
            found["plan"] = self.plan.summary()
        return found


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
