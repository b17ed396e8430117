"""Which source reads a run. Every kind of source is registered with what it takes (a test
on the run's options), how it is opened (its module is imported only when it is chosen),
and which groups of options only it reads; make_source() opens the first kind that takes
the run, after refusing options that only another kind reads (a flag that would do
nothing is the user's mistake, said at once).

A kind from another package registers itself when its module is imported (a pull's blobs:
oci/blobs.py); a run of a SourcePlan is read by the kind its plan names.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from bulkfetch.config import (
    ApiShape,
    GetOptions,
    RequestAuth,
    S3Options,
    SourceShape,
    TableOptions,
)
from bulkfetch.errors import UsageError
from bulkfetch.sources.base import Source

# (options, listing) -> the source; `listing` False for a worker, which only resolves items
Opener = Callable[[GetOptions, bool], Source]

# Option groups (GetOptions fields) that only some kinds read: the flags that set them, what
# they apply to, and the group's defaults (a group left at them is not given).
_GROUPS: dict[str, tuple[str, str, object]] = {
    "shape": ("--list-path, --names-key, --next-key, --marker-param and --get-template",
              "a listing API's URL", SourceShape()),
    "table": ("--url-col, --name-col, --name-template and --save-cols",
              "a .csv, .tsv, .jsonl or .parquet table (--from-file)", TableOptions()),
    "s3": ("--endpoint-url, --region, --profile, --no-sign-request, --addressing-style, "
           "--include, --exclude and --list-concurrency", "an s3:// source", S3Options()),
}


@dataclass(frozen=True)
class SourceKind:
    name: str
    open: Opener
    what: str  # how a message names a source of this kind: "... is {what}"
    # whether it reads the run of these options (None: a plan's kind, found by name)
    takes: Callable[[GetOptions], bool] | None = None
    reads: frozenset[str] = frozenset()  # the groups of _GROUPS it reads


def _require_regular_file(path: str) -> None:
    """--from-file is read more than once (names checked for collisions first, then page by
    page from byte offsets, again on a rerun): a pipe or stdin cannot be."""
    if path == "-":
        raise UsageError("--from-file -: standard input cannot be read again to resume; save "
                         "the list first (e.g. `... > urls.txt`) and give --from-file urls.txt")
    try:
        found = os.stat(path)
    except OSError as exc:
        raise UsageError(f"--from-file {path!r}: {exc.strerror}") from None
    if not stat.S_ISREG(found.st_mode):
        raise UsageError(f"--from-file {path!r} is not a regular file (a pipe or a device "
                         "cannot be read again to resume); save the list in a file first "
                         "and give that")


def _is_table(options: GetOptions) -> bool:
    from bulkfetch.sources.table import table_format

    return options.from_file and table_format(options.source) is not None


def _open_table(options: GetOptions, listing: bool) -> Source:
    from bulkfetch.sources.table import TableSource

    if listing:
        _require_regular_file(options.source)
    return TableSource(options.source, options.table, listing=listing)


def _open_url_list(options: GetOptions, listing: bool) -> Source:
    from bulkfetch.sources.urllist import UrlListSource

    if listing:
        _require_regular_file(options.source)
    return UrlListSource(options.source)


def _open_s3(options: GetOptions, listing: bool) -> Source:
    from bulkfetch.sources.s3 import S3Source  # loads the S3 settings only when used

    return S3Source(options.source, options.s3, options.timeouts,
                    options.limits.max_page_size, tls=options.tls)


def _open_index(options: GetOptions, listing: bool) -> Source:
    from bulkfetch.sources.crawl import IndexSource

    assert options.crawl is not None
    return IndexSource(options.source, options.crawl, options.timeouts,
                       options.limits.max_page_size, options.tls, options.auth)


def _open_json_api(options: GetOptions, listing: bool) -> Source:
    from bulkfetch.sources.jsonapi import JsonApiSource  # jmespath only when used

    # (headers with the seed API's shape: the seed shape, read by the JSON source, which
    # is the one that sends them; the seed fast path stays free of them)
    return JsonApiSource(options.source, options.shape,
                         options.api or seed_api_shape(options), options.auth,
                         options.timeouts, options.limits.max_page_size, options.tls)


def _open_seed(options: GetOptions, listing: bool) -> Source:
    from bulkfetch.sources.fileserver import FileServerSource

    return FileServerSource(options.source, options.shape, options.timeouts,
                            options.limits.max_page_size, options.tls)


def seed_api_shape(options: GetOptions) -> ApiShape:
    """The seed API's shape (names_key, next_key, marker_param) as the JSON source's."""
    shape = options.shape
    return ApiShape(items=shape.names_key, next=shape.next_key,
                    next_param=shape.marker_param)


# In the order they are tried; plans' kinds are found by name.
_KINDS: list[SourceKind] = [
    SourceKind("table", _open_table, "a table", _is_table, frozenset({"table"})),
    SourceKind("url-list", _open_url_list, "read as one URL a line",
               lambda options: options.from_file),
    SourceKind("s3", _open_s3, "an s3:// source",
               lambda options: options.source.startswith("s3://"), frozenset({"s3"})),
    SourceKind("index", _open_index, "a web server's directory listing",
               lambda options: options.crawl is not None),
    SourceKind("json-api", _open_json_api, "a JSON listing API's URL",
               lambda options: options.api is not None or options.auth != RequestAuth(),
               frozenset({"shape"})),
    SourceKind("seed", _open_seed, "a listing API's URL", lambda options: True,
               frozenset({"shape"})),
]
_PLANS: dict[str, SourceKind] = {}


def register(kind: SourceKind) -> None:
    """Add a kind that reads a SourcePlan whose `kind` is `kind.name` (a pull's blobs)."""
    _PLANS[kind.name] = kind


def kind_of(options: GetOptions) -> SourceKind:
    """The kind that reads the run `options` describe."""
    if options.plan is not None:
        found = _PLANS.get(options.plan.kind)
        if found is None:
            raise UsageError(f"no source reads a plan of kind {options.plan.kind!r}")
        return found
    return next(kind for kind in _KINDS if kind.takes is not None and kind.takes(options))


def make_source(options: GetOptions, listing: bool = True) -> Source:
    """The run's source; `listing=False` for a worker, which only resolves items. Options
    that only another kind of source reads are refused (UsageError)."""
    kind = kind_of(options)
    for group, (flags, target, default) in _GROUPS.items():
        if group not in kind.reads and getattr(options, group) != default:
            raise UsageError(f"{flags} apply to {target}; {options.source!r} is {kind.what}")
    return kind.open(options, listing)
