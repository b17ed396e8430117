"""Where names come from: a paginated JSON API, an S3 bucket, a list of URLs, or a table
of them."""

from __future__ import annotations

import os
import stat

from bulkfetch.config import (
    ApiShape,
    GetOptions,
    RequestAuth,
    S3Options,
    SourceShape,
    TableOptions,
)
from bulkfetch.errors import UsageError
from bulkfetch.sources.base import ListedPage, ListingError, Source
from bulkfetch.sources.fileserver import FileServerSource
from bulkfetch.sources.table import TableSource, table_format
from bulkfetch.sources.urllist import UrlListSource


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


def make_source(options: GetOptions, listing: bool = True) -> Source:
    """The run's source; `listing=False` for a worker, which only resolves items."""
    if options.blobs is not None:
        from bulkfetch.oci.blobs import BlobSource

        return BlobSource(options.blobs)
    if options.from_file:
        if listing:
            _require_regular_file(options.source)
        if table_format(options.source) is not None:
            return TableSource(options.source, options.table, listing=listing)
        if options.table != TableOptions():
            raise UsageError("--url-col, --name-col, --name-template and --save-cols apply to a "
                             f".csv, .tsv, .jsonl or .parquet table; {options.source!r} is read "
                             "as one URL a line")
        return UrlListSource(options.source)
    if options.source.startswith("s3://"):
        from bulkfetch.sources.s3 import S3Source  # loads the S3 settings only when used

        return S3Source(options.source, options.s3, options.timeouts,
                        options.limits.max_page_size, tls=options.tls)
    if options.s3 != S3Options():
        raise UsageError("--endpoint-url, --region, --profile, --no-sign-request, "
                         "--addressing-style, --include, --exclude and --list-concurrency "
                         f"apply to an s3:// source; {options.source!r} is not one")
    if options.api is not None or options.auth != RequestAuth():
        from bulkfetch.sources.jsonapi import JsonApiSource  # jmespath only when used

        # (headers with the seed API's shape: the seed shape, read by the JSON source,
        # which is the one that sends them; the seed fast path stays free of them)
        return JsonApiSource(options.source, options.shape,
                             options.api or seed_api_shape(options.shape), options.auth,
                             options.timeouts, options.limits.max_page_size, options.tls)
    return FileServerSource(options.source, options.shape, options.timeouts,
                            options.limits.max_page_size, options.tls)


def seed_api_shape(shape: SourceShape) -> ApiShape:
    """The seed API's shape (names_key, next_key, marker_param) as the JSON source's."""
    return ApiShape(items=shape.names_key, next=shape.next_key,
                    next_param=shape.marker_param)


__all__ = ["FileServerSource", "ListedPage", "ListingError", "Source", "TableSource",
           "UrlListSource", "make_source"]
