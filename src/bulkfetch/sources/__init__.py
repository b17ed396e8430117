"""Where names come from: a paginated JSON API or a list of URLs."""

from __future__ import annotations

from bulkfetch.config import GetOptions
from bulkfetch.sources.base import ListedPage, ListingError, Source
from bulkfetch.sources.fileserver import FileServerSource
from bulkfetch.sources.urllist import UrlListSource


def make_source(options: GetOptions) -> Source:
    if options.from_file:
        return UrlListSource(options.source)
    return FileServerSource(options.source, options.shape, options.timeouts,
                            options.limits.max_page_size)


__all__ = ["FileServerSource", "ListedPage", "ListingError", "Source", "UrlListSource",
           "make_source"]
