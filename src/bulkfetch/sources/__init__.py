"""Where names come from: a paginated JSON API, an S3 bucket, a list of URLs, or a table
of them. Each is a Source (base.py) declaring its Abilities (abilities.py); registry.py
says which one reads a run."""

from __future__ import annotations

from bulkfetch.sources.base import Source
from bulkfetch.sources.listed import ListedPage, ListingError
from bulkfetch.sources.registry import make_source

__all__ = ["ListedPage", "ListingError", "Source", "make_source"]
