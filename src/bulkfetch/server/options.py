"""Everything `bulkfetch serve` can be told, as one frozen value, and how to build the app."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

from bulkfetch.errors import UsageError
from bulkfetch.server.app import App
from bulkfetch.server.dataset import MAX_EPOCH, DataSet, SyntheticDataSet
from bulkfetch.server.faults import Attempts, FaultConfig, FaultPlan
from bulkfetch.server.hostile import BAD_PAGE_KINDS, BadPages, HostileNames, HugeFirstPage
from bulkfetch.server.http import Handler
from bulkfetch.server.limits import MAX_RPS
from bulkfetch.server.s3app import S3App
from bulkfetch.server.tree import FileTree
from bulkfetch.util.sizes import SizeSpec, parse_size_spec


@dataclass(frozen=True)
class ServeOptions:
    files: int = 1000
    page_size: int = 1000
    file_size: SizeSpec = field(default_factory=lambda: parse_size_spec("100"))
    seed: int = 0
    nested: bool = False
    root: str | None = None
    show_total: bool = True
    faults: FaultConfig = field(default_factory=FaultConfig)
    hostile_names: bool = False
    bad_pages: frozenset[str] = frozenset()
    huge_page: int | None = None  # names on the first list page, streamed; None: page_size
    host: str = "127.0.0.1"
    port: int = 8000
    processes: int = 1
    access_log: str | None = None  # "-" for stderr, else a file path
    # What clients of big files must be tested against (issue 18):
    digest_header: bool = False  # Repr-Digest: sha-256=:...: on file answers
    bandwidth_per_connection: int = 0  # body bytes/s of each connection; 0: no limit
    ignore_ranges: bool = False  # every ranged GET is answered 200 with the whole body
    wrong_content_range: bool = False  # a ranged GET gets another range than it asked for
    etag_salt: str = ""  # mixed into every synthetic body, ETag and Last-Modified
    # What `get --sync` is tested against (issue 24): in each epoch 2..epoch this share of
    # the synthetic files change body, ETag and Last-Modified (dataset.py's docstring)
    epoch: int = 1
    mutate_rate: float = 0.0
    # The data set as an S3 bucket too (server/s3app.py); None: the seed API only.
    s3_bucket: str | None = None
    s3_credentials: str | None = None  # "KEY:SECRET": S3 requests must be signed with it
    s3_session_token: str | None = None  # ... and carry this token (temporary credentials)
    list_latency_ms: tuple[float, float] = (0.0, 0.0)  # added to every list page's delay
    # Politeness tests (limits.py), across all processes; None: no limit
    max_concurrent: int | None = None  # requests in flight; more are answered 503
    max_rps: int | None = None  # requests accepted in any one second; more get 429 (S3: 503)
    # Real listing APIs (issue 25, server/shapes.py): the data set listed as `shape` lists,
    # beside the seed API; "seed" builds the plain App, with no wrapper at all
    shape: str = "seed"
    # --shape index and index-json (server/index_shape.py): entries to a directory
    index_fanout: int = 50
    # Every request must carry 'Authorization: Bearer TOKEN' (else 401); not with --s3,
    # whose Authorization header is a SigV4 signature
    bearer_token: str | None = None
    # File GETs answered 302 to the same target on this origin (http://HOST:PORT): a second
    # server, so that a client's credentials across hosts can be tested
    redirect_files_to: str | None = None

    def __post_init__(self) -> None:
        if self.files < 0:
            raise UsageError(f"--files must be >= 0, got {self.files}")
        if self.page_size < 1:
            raise UsageError(f"--page-size must be >= 1, got {self.page_size}")
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port must be 0..65535, got {self.port}")
        if self.processes < 1:
            raise UsageError(f"--processes must be >= 1, got {self.processes}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise UsageError(f"--max-concurrent must be >= 1, got {self.max_concurrent}")
        if self.max_rps is not None and not 1 <= self.max_rps <= MAX_RPS:
            raise UsageError(f"--max-rps must be 1..{MAX_RPS:,}, got {self.max_rps}")
        unknown = self.bad_pages - set(BAD_PAGE_KINDS)
        if unknown:
            raise UsageError(
                f"--bad-pages: unknown kind {', '.join(sorted(unknown))}; "
                f"choose from {', '.join(BAD_PAGE_KINDS)}"
            )
        if self.huge_page is not None:
            if self.huge_page < 1:
                raise UsageError(f"--huge-page must be >= 1, got {self.huge_page}")
            if self.root is not None or self.hostile_names or self.bad_pages:
                raise UsageError("--huge-page works on the plain synthetic data set, not with "
                                 "--root, --hostile-names or --bad-pages")
        if self.bandwidth_per_connection < 0:
            raise UsageError(f"--bandwidth-per-connection must be >= 0 bytes/s, "
                             f"got {self.bandwidth_per_connection}")
        if self.ignore_ranges and self.wrong_content_range:
            raise UsageError("--ignore-ranges and --wrong-content-range exclude each other")
        try:
            self.etag_salt.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError("--etag-salt must be valid UTF-8 text") from None
        if not 1 <= self.epoch <= MAX_EPOCH:
            raise UsageError(f"--epoch must be 1..{MAX_EPOCH:,}, got {self.epoch}")
        if not (math.isfinite(self.mutate_rate) and 0.0 <= self.mutate_rate <= 1.0):
            raise UsageError(f"--mutate-rate must be between 0 and 1, got {self.mutate_rate}")
        if self.s3_bucket is not None:
            from bulkfetch.server.s3app import check_bucket_name

            why = check_bucket_name(self.s3_bucket)
            if why is not None:
                raise UsageError(f"--s3-bucket {self.s3_bucket!r}: a bucket name is {why}")
            if self.huge_page is not None or self.bad_pages:
                raise UsageError("--huge-page and --bad-pages break the seed API's pages; "
                                 "they do not apply with --s3")
        elif self.s3_credentials is not None:
            raise UsageError("--s3-credentials applies with --s3")
        elif self.shape == "seed" and self.faults.misstates:
            raise UsageError("--stale-rate and --lie-md5 misstate listings of sizes and "
                             "digests: they apply with --s3 or --shape (the seed API lists "
                             "names only)")
        if self.s3_session_token is not None and self.s3_credentials is None:
            raise UsageError("--s3-session-token goes with --s3-credentials (the temporary "
                             "access key and secret it belongs to)")
        if self.s3_credentials is not None:
            from bulkfetch.server.sigv4 import parse_credentials

            parse_credentials(self.s3_credentials)  # raises UsageError naming the flag
        if self.root is not None:
            if self.etag_salt:
                raise UsageError("--etag-salt changes synthetic files; with --root, change "
                                 "the files themselves")
            if self.epoch > 1 or self.mutate_rate > 0:
                raise UsageError("--epoch and --mutate-rate change synthetic files; with "
                                 "--root, change the files themselves")
            if not os.path.isdir(self.root):
                raise UsageError(f"--root {self.root!r} is not a directory")
            if self.hostile_names or self.bad_pages:
                raise UsageError("--hostile-names and --bad-pages work on the synthetic data set, "
                                 "not with --root")
        self._check_shape()

    def _check_shape(self) -> None:
        from bulkfetch.server.gates import check_bearer_token, check_origin
        from bulkfetch.server.shapes import SHAPES

        if self.shape not in SHAPES:
            raise UsageError(f"--shape {self.shape!r}: choose from {', '.join(SHAPES)}")
        if self.shape != "seed":
            if self.s3_bucket is not None:
                raise UsageError(f"--shape {self.shape} and --s3 exclude each other: one "
                                 "listing API a server")
            if self.huge_page is not None or self.bad_pages:
                raise UsageError("--huge-page and --bad-pages break the seed API's pages; "
                                 "they do not apply with --shape")
        if self.shape in ("index", "index-json"):
            self._check_index_shape()
        if self.bearer_token is not None:
            why = check_bearer_token(self.bearer_token)
            if why is not None:
                raise UsageError(f"--require-bearer: {why}")
            if self.s3_bucket is not None:
                raise UsageError("--require-bearer does not apply with --s3 (S3 requests "
                                 "carry a SigV4 signature in Authorization: see "
                                 "--s3-credentials)")
        if self.redirect_files_to is not None:
            why = check_origin(self.redirect_files_to)
            if why is not None:
                raise UsageError(f"--redirect-files-to {self.redirect_files_to!r}: {why}")
            if self.s3_bucket is not None:
                raise UsageError("--redirect-files-to applies to the seed API and --shape, "
                                 "not to --s3")
        if self.faults.lie_md5:
            # A name the data set does not have would lie about nothing, silently
            dataset = build_dataset(self)
            missing = sorted(name for name in self.faults.lie_md5
                             if dataset.lookup(name) is None)
            if missing:
                raise UsageError(f"--lie-md5: no such file in the data set: "
                                 f"{', '.join(map(repr, missing[:5]))}")

    def _check_index_shape(self) -> None:
        from bulkfetch.server.index_shape import MAX_FANOUT

        if not 2 <= self.index_fanout <= MAX_FANOUT:
            raise UsageError(f"--index-fanout must be 2..{MAX_FANOUT}, got {self.index_fanout}")
        if self.root is not None or self.nested or self.hostile_names:
            raise UsageError(f"--shape {self.shape} lays out the synthetic data set's flat "
                             "names as a tree of its own: not with --root, --nested or "
                             "--hostile-names")
        if self.faults.lie_md5:
            raise UsageError(f"--lie-md5 has nothing to misstate with --shape {self.shape}: "
                             "its listings state no digest (--stale-rate misstates sizes)")

    def describe(self) -> str:
        if self.root is not None:
            return f"files under {os.path.realpath(self.root)}, {self.page_size:,} names a page"
        if self.huge_page is not None:
            first = min(self.huge_page, self.files)
            rest = -(-(self.files - first) // self.page_size)
            return (f"{self.files:,} files, a first page of {first:,} and {rest:,} "
                    f"of {self.page_size:,}, {self.file_size.describe()}, seed {self.seed}"
                    f"{self._describe_epoch()}")
        pages = max(1, -(-self.files // self.page_size))
        per_page = min(self.page_size, self.files) if pages == 1 else self.page_size
        return (f"{self.files:,} files, {pages:,} page{'s' if pages != 1 else ''} "
                f"of {per_page:,}, "
                f"{self.file_size.describe()}, seed {self.seed}{self._describe_epoch()}")

    def _describe_epoch(self) -> str:
        # Only when asked for: the banner of a plain server reads as it always did
        if self.epoch == 1 and self.mutate_rate == 0:
            return ""
        return f", epoch {self.epoch} at mutate rate {self.mutate_rate:g}"


def build_dataset(options: ServeOptions) -> DataSet:
    if options.root is not None:
        return FileTree(options.root, options.page_size)
    dataset: DataSet = SyntheticDataSet(
        options.files, options.page_size, options.seed, options.file_size, options.nested,
        salt=options.etag_salt, epoch=options.epoch, mutate_rate=options.mutate_rate,
    )
    if options.huge_page is not None:
        assert isinstance(dataset, SyntheticDataSet)
        return HugeFirstPage(dataset, options.huge_page)
    if options.hostile_names:
        assert isinstance(dataset, SyntheticDataSet)
        dataset = HostileNames(dataset)
    if options.bad_pages:
        assert isinstance(dataset, SyntheticDataSet | HostileNames)
        dataset = BadPages(dataset, options.bad_pages)
    return dataset


def build_app(options: ServeOptions, port: int | None = None,
              attempts: Attempts | None = None) -> App | S3App | Handler:
    """`port`: where the server really listens (with --port 0, known only once bound);
    `attempts`: the attempt counts faults are decided by, when shared with other processes."""
    faults = (FaultPlan(options.faults, options.seed, attempts) if options.faults.active
              else None)
    app = App(build_dataset(options), faults, show_total=options.show_total,
              port=options.port if port is None else port,
              digest_header=options.digest_header, ignore_ranges=options.ignore_ranges,
              wrong_content_range=options.wrong_content_range,
              list_latency_ms=options.list_latency_ms)
    if options.s3_bucket is None:
        if options.shape == "seed" and options.bearer_token is None \
                and options.redirect_files_to is None:
            return app  # the seed API as it always was: nothing in front of it
        return _shaped(options, app)
    if options.s3_credentials is None:
        return S3App(app, options.s3_bucket)
    from bulkfetch.server.sigv4 import parse_credentials

    credentials = dataclasses.replace(parse_credentials(options.s3_credentials),
                                      session_token=options.s3_session_token)
    return S3App(app, options.s3_bucket, credentials)


def _shaped(options: ServeOptions, app: App) -> Handler:
    """The handler for --shape, --require-bearer and --redirect-files-to, chosen once at
    start-up: the bearer check first (a 401 before anything else), then the redirect of
    file GETs, then the shape's routes (or the seed API's)."""
    from bulkfetch.server.gates import BearerGate, FileRedirect, seed_file_target
    from bulkfetch.server.hf_shape import HF_APPS
    from bulkfetch.server.index_shape import INDEX_APPS
    from bulkfetch.server.shapes import SHAPE_APPS, ShapeApp

    handler: Handler = app
    is_file = seed_file_target
    if options.shape != "seed":
        host = f"[{options.host}]" if ":" in options.host else options.host
        origin = f"http://{host}:{app.port}"
        if options.shape in INDEX_APPS:
            shaped: ShapeApp = INDEX_APPS[options.shape](app, origin, options.index_fanout)
        else:
            shaped = {**SHAPE_APPS, **HF_APPS}[options.shape](app, origin)
        handler, is_file = shaped, shaped.file_target
    if options.redirect_files_to is not None:
        handler = FileRedirect(handler, options.redirect_files_to, is_file)
    if options.bearer_token is not None:
        handler = BearerGate(handler, options.bearer_token)
    return handler
