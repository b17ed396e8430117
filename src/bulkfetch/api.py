"""The library API: `download(url, dest, **options) -> Report`."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Sequence

from bulkfetch.config import (
    DEFAULT_MAX_PAGE_SIZE,
    LEASE_S,
    SHARD_FILES,
    SHARD_SIZE,
    ApiShape,
    CrawlOptions,
    DeleteLimit,
    GetOptions,
    Limits,
    RequestAuth,
    RetryPolicy,
    RunnerOptions,
    S3Options,
    SinkOptions,
    SourceShape,
    SyncOptions,
    TableOptions,
    Timeouts,
    TlsOptions,
)
from bulkfetch.errors import UsageError
from bulkfetch.models import Progress, Report

AUTO_START = 4  # --concurrency auto's first limit (issue 47: slow start grows it fast)


def _concurrency(value: int | str) -> tuple[bool, int]:
    """(adaptive, first limit) of --concurrency: a number, or "auto"."""
    text = str(value).strip().lower()
    if text == "auto":
        return True, AUTO_START
    if not text.isdigit():
        raise UsageError(f"--concurrency {value!r}: give a number of transfers or auto")
    return False, int(text)  # Limits refuses 0


def build_options(
    source: str,
    dest: str | os.PathLike[str],
    *,
    from_file: bool = False,
    workers: int | None = None,
    concurrency: int | str = "auto",
    max_concurrency: int = 4096,
    per_host: int = 0,
    max_rps: float = 0.0,
    limit_rate: int = 0,
    pages_ahead: int = 0,
    sink: str = "dir",
    fanout: int = 0,
    shard_files: int = SHARD_FILES,
    shard_size: int = SHARD_SIZE,
    verify: bool = True,
    retries: int = 8,
    max_retry_wait: float = 60.0,
    connect_timeout: float = 10.0,
    idle_timeout: float = 30.0,
    total_timeout: float | None = None,
    min_speed: int = 100,
    max_page_size: int = DEFAULT_MAX_PAGE_SIZE,
    spool_above: int = 1 << 20,
    split_above: int = 64 << 20,
    parts: int = 8,
    list_path: str | None = None,
    names_key: str | None = None,
    next_key: str | None = None,
    marker_param: str | None = None,
    get_template: str | None = None,
    api: str | None = None,
    api_file: str | os.PathLike[str] | None = None,
    items: str | None = None,
    name_path: str | None = None,
    size_path: str | None = None,
    md5_path: str | None = None,
    sha256_path: str | None = None,
    url_path: str | None = None,
    total_path: str | None = None,
    paginate: str | None = None,
    next_path: str | None = None,
    next_param: str | None = None,
    page_param: str | None = None,
    limit_param: str | None = None,
    page_size: int | None = None,
    first_page: int | None = None,
    allow_cross_host_pages: bool | None = None,
    headers: Sequence[str] = (),
    header_file: str | os.PathLike[str] | None = None,
    bearer_env: str | None = None,
    netrc: bool = False,
    restart: bool = False,
    retry_failed: bool = False,
    sync: bool = False,
    delete: bool = False,
    dry_run: bool = False,
    max_delete: int | str | None = None,
    checksum: bool = False,
    url_col: str = "url",
    name_col: str | None = None,
    name_template: str | None = None,
    save_cols: tuple[str, ...] = (),
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
    no_sign_request: bool = False,
    addressing_style: str = "auto",
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    list_concurrency: int | None = None,
    max_depth: int | None = None,
    ca_bundle: str | os.PathLike[str] | None = None,
    insecure: bool = False,
    metrics: str | None = None,
    runner: str = "local",
    ray_address: str | None = None,
    lease: float | None = None,
) -> GetOptions:
    """Validated, frozen options; raises bulkfetch.UsageError naming the bad input.

    TLS trust: `ca_bundle`, else REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE or SSL_CERT_FILE from
    the environment (the first one set), else libcurl's own store; `insecure` verifies
    nothing (see bulkfetch.net.tls).

    Listing shape: the seed API's by default (`list_path`, `names_key`, `next_key`,
    `marker_param`, `get_template`: None for its defaults). `api="index"` crawls a web
    server's directory listings under `source` (as does a URL ending in '/' whose answer is
    one, when no other listing parameter is given), with `max_depth`, `include`, `exclude`
    and `list_concurrency`. `api` (a preset: gcs, github-releases, drf, hf-tree, seed) or
    `api_file` (a TOML file of the same keys) load
    another; `items`, `name_path`, `size_path`, `md5_path`, `sha256_path`, `url_path`,
    `total_path`, `next_path` (JMESPath), `paginate` (token, url, link, offset, page, none),
    `next_param`, `page_param`, `limit_param`, `page_size`, `first_page` and
    `allow_cross_host_pages` override them (bulkfetch.sources.apis). `headers` ("Name:
    value"), `header_file`, `bearer_env` (the variable holding a bearer token) and `netrc`
    authenticate listing and file requests, only to the listing's and the files' hosts.

    `runner="ray"`: the workers are Ray actors on the cluster at `ray_address` ("auto",
    HOST:PORT; else RAY_ADDRESS, else a Ray started for the run), one per CPU unless
    `workers` caps them; DEST must be on storage every node sees; an actor silent for
    `lease` seconds (30 unless given) is stopped and its pages go to the others. Needs
    bulkfetch[ray]."""
    from bulkfetch.net.tls import resolve_tls

    tls = resolve_tls(ca_bundle, insecure)
    if metrics is not None:
        from bulkfetch.runners.metrics import check_available

        check_available(metrics)
    adaptive, start = _concurrency(concurrency)
    timeouts = Timeouts(connect_s=connect_timeout, idle_s=idle_timeout, total_s=total_timeout,
                        min_speed=min_speed)
    shape_flags = {
        "list_path": list_path, "names_key": names_key, "next_key": next_key,
        "marker_param": marker_param, "get_template": get_template, "items": items,
        "name": name_path, "size": size_path, "md5": md5_path, "sha256": sha256_path,
        "url": url_path, "total": total_path, "paginate": paginate, "next": next_path,
        "next_param": next_param, "page_param": page_param, "limit_param": limit_param,
        "page_size": page_size, "first_page": first_page,
        "allow_cross_host_pages": allow_cross_host_pages}
    json_shape = api_file is not None or any(v is not None for v in shape_flags.values())
    auth = _auth(source, from_file, headers, header_file, bearer_env, netrc)
    crawl = _crawl(str(source), from_file, api, json_shape, auth, max_depth, include,
                   exclude, list_concurrency, timeouts, tls)
    if crawl is not None:  # its filters are the crawl's; the JSON shape is none
        api, include, exclude, list_concurrency = None, (), (), None
        shape, api_shape = SourceShape(), None
    else:
        shape, api_shape = _listing(source, from_file, api, api_file, auth, shape_flags)
    return GetOptions(
        source=str(source),
        dest=os.fspath(dest),
        from_file=from_file,
        shape=shape,
        api=api_shape,
        auth=auth,
        limits=Limits(workers=workers or os.cpu_count() or 1,
                      concurrency=start, adaptive=adaptive, max_concurrency=max_concurrency,
                      pages_ahead=pages_ahead, per_host=per_host, max_rps=max_rps,
                      limit_rate=limit_rate, max_page_size=max_page_size,
                      spool_above=spool_above, split_above=split_above, parts=parts),
        sink=SinkOptions(kind=sink, fanout=fanout, shard_files=shard_files,
                         shard_size=shard_size),
        retry=RetryPolicy(retries=retries, max_retry_wait_s=max_retry_wait),
        timeouts=timeouts,
        verify=verify,
        restart=restart,
        retry_failed=retry_failed,
        sync=_sync_options(sync, delete, dry_run, max_delete, sink, restart, retry_failed,
                           checksum),
        table=TableOptions(url_col, name_col, name_template, tuple(save_cols)),
        s3=S3Options(endpoint_url, region, profile, no_sign_request, addressing_style,
                     tuple(include), tuple(exclude),
                     S3Options.list_concurrency if list_concurrency is None
                     else list_concurrency),
        crawl=crawl,
        tls=tls,
        metrics=metrics,
        runner=RunnerOptions(runner, ray_address, workers_given=workers is not None,
                             lease_s=LEASE_S if lease is None else lease),
    )


def _crawl(source: str, from_file: bool, api: str | None, json_shape: bool,
           auth: RequestAuth, max_depth: int | None,
           include: Sequence[str], exclude: Sequence[str], list_concurrency: int | None,
           timeouts: Timeouts, tls: TlsOptions) -> CrawlOptions | None:
    """A web server's directory tree to crawl: `api="index"`, or (with no listing API's
    flag given) a URL ending in '/' whose answer is a directory listing, asked for with the
    request headers given; else None."""
    given = api == "index"
    is_url = not from_file and source.lower().startswith(("http://", "https://"))
    if given and not is_url:
        raise UsageError(f"--api index crawls a web server's directory listing at an "
                         f"http(s):// URL; {source!r} is not one")
    if given and json_shape:
        raise UsageError("--api index reads a web server's directory listings: a JSON "
                         "listing's flags (--api-file, --items, --next ...) do not apply "
                         "to it")
    if not given:
        from bulkfetch.sources.crawl import answers_a_listing

        if not (is_url and api is None and not json_shape and source.endswith("/")
                and answers_a_listing(source, timeouts, tls, auth)):
            if max_depth is not None:
                raise UsageError(f"--max-depth applies to a web server's directory "
                                 f"listing (--api index, or a URL ending in '/' that answers "
                                 f"one); {source!r} is not one")
            return None
    return CrawlOptions(max_depth, tuple(include), tuple(exclude),
                        CrawlOptions.list_concurrency if list_concurrency is None
                        else list_concurrency)


def _auth(source: str | os.PathLike[str], from_file: bool, headers: Sequence[str],
          header_file: str | os.PathLike[str] | None, bearer_env: str | None,
          netrc: bool) -> RequestAuth:
    """The requests' headers and --netrc: for a listing API's URL or a directory tree."""
    if not headers and header_file is None and bearer_env is None and not netrc:
        return RequestAuth()
    if from_file or str(source).startswith("s3://"):
        raise UsageError("--header, --header-file, --bearer-env and --netrc apply to a "
                         "listing API's or a directory tree's URL; "
                         f"{str(source)!r} is not one")
    from bulkfetch.sources.headers import build_auth

    return build_auth(headers, os.fspath(header_file) if header_file is not None else None,
                      bearer_env, netrc)


def _listing(source: str, from_file: bool, api: str | None,
             api_file: str | os.PathLike[str] | None, auth: RequestAuth,
             given: dict[str, object]) -> tuple[SourceShape, ApiShape | None]:
    """The listing's shape. Only the shape flags the caller gave (not None) override the
    preset; nothing is loaded for the seed API's default run."""
    asked = {key: value for key, value in given.items() if value is not None}
    wants_auth = auth != RequestAuth()
    if not asked and api is None and api_file is None and not wants_auth:
        return SourceShape(), None
    legacy = {"list_path", "names_key", "next_key", "marker_param", "get_template"}
    if from_file or str(source).startswith("s3://"):
        if asked.keys() <= legacy and api is None and api_file is None:
            return SourceShape(**asked), None  # type: ignore[arg-type]
        raise UsageError("--api, --api-file and the listing's shape flags (--items, --next "
                         f"...) apply to a JSON listing API's URL; {str(source)!r} is not "
                         "one")
    from bulkfetch.sources.apis import resolve_shape

    return resolve_shape(api, os.fspath(api_file) if api_file else None, asked,
                         generic=bool(auth.headers))


def _sync_options(sync: bool, delete: bool, dry_run: bool, max_delete: int | str | None,
                  sink: str, restart: bool, retry_failed: bool,
                  checksum: bool = False) -> SyncOptions:
    limit = None if max_delete is None else DeleteLimit.parse(str(max_delete))
    options = SyncOptions(sync, delete, dry_run, limit, checksum)
    if sync and sink != "dir":
        why = {"tar": "tar shards are not rewritten in place",
               "null": "it stores nothing to keep in step"}.get(sink, "")
        raise UsageError(f"--sync keeps a directory in step with the source (--sink dir), "
                         f"not --sink {sink}" + (f": {why}" if why else ""))
    if sync and retry_failed:
        raise UsageError("--sync lists the source again itself and fetches what is missing: "
                         "drop --retry-failed")
    return options


def download(
    url: str,
    dest: str | os.PathLike[str],
    *,
    progress: Callable[[Progress], None] | None = None,
    **options: object,
) -> Report:
    """Download every file `url` lists into `dest` and return the Report.

    Rerunning with the same url and dest resumes. `progress`, if given, is called about ten
    times a second with a Progress snapshot. Keyword options are those of build_options().
    """
    from bulkfetch.runners.local import run

    with python_terms():
        return run(build_options(url, dest, **options), on_progress=progress)  # type: ignore[arg-type]


# The CLI's flags whose build_options() parameter is named otherwise, and the flags that
# stand for a boolean parameter's non-default value.
_PARAMETER_OF = {"timeout": "total_timeout", "name": "name_path", "size": "size_path",
                 "md5": "md5_path", "sha256": "sha256_path", "url": "url_path",
                 "total": "total_path", "next": "next_path", "header": "headers",
                 "no-verify": "verify=False", "addressing-style": "addressing_style"}
_FLAG = re.compile(r"--([a-z][a-z0-9-]*)")


def in_python_terms(message: str) -> str:
    """`message` with the CLI's flags named as build_options()' parameters: --restart as
    restart=True, --max-delete as max_delete (what a Python caller types)."""
    import inspect

    parameters = inspect.signature(build_options).parameters

    def name(match: re.Match[str]) -> str:
        flag = match.group(1)
        found = _PARAMETER_OF.get(flag, flag.replace("-", "_"))
        parameter = parameters.get(found)
        if parameter is None:
            return found if "=" in found else match.group(0)
        return f"{found}=True" if parameter.default is False else found
    return _FLAG.sub(name, message)


@contextlib.contextmanager
def python_terms() -> Iterator[None]:
    """UsageErrors raised within, said in Python's terms (their type and fields kept)."""
    try:
        yield
    except UsageError as exc:
        exc.args = (in_python_terms(str(exc)), *exc.args[1:])
        raise
