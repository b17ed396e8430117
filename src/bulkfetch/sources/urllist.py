"""`--from-file URLS.txt`: one URL per line, streamed page by page; a page's token is the
byte offset where it starts, so resuming never re-reads the file from the top."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import unquote, urlsplit

from bulkfetch.errors import UsageError
from bulkfetch.sources.base import ListedPage, ListingError

LINES_PER_PAGE = 1000


class UrlListSource:
    def __init__(self, path: str, lines_per_page: int = LINES_PER_PAGE) -> None:
        self.path = path
        self.lines_per_page = lines_per_page
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise UsageError(f"--from-file {path!r}: {exc.strerror}") from None

    def describe(self) -> str:
        return f"URLs listed in {self.path}"

    def list_page(self, token: str | None) -> ListedPage:
        offset = int(token) if token else 0
        items: list[str] = []
        try:
            with open(self.path, "rb") as handle:
                handle.seek(offset)
                while len(items) < self.lines_per_page:
                    line = handle.readline()
                    if not line:
                        return ListedPage(tuple(items), None)
                    text = line.decode("utf-8", "surrogateescape").strip()
                    if text and not text.startswith("#"):
                        items.append(text)
                following = handle.tell()
                more = handle.read(1) != b""
        except OSError as exc:
            raise ListingError(f"reading {self.path}: {exc.strerror}", retryable=False) from None
        return ListedPage(tuple(items), str(following) if more else None)

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        return None  # every item is a URL to take apart

    def resolve(self, item: str) -> tuple[str, str]:
        parts = urlsplit(item)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http:// or https:// URL")
        return url_name(parts.path), item


def url_name(path: str) -> str:
    """A file's name from its URL's path alone: decoded, without the leading slash."""
    return unquote(path, errors="surrogateescape").lstrip("/")
