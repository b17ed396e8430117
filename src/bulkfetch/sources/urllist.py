"""`--from-file URLS.txt`: one URL per line, streamed page by page; a page's token is the
byte offset where it starts, so resuming never re-reads the file from the top. A file is
named by its URL's path; a line whose name an earlier line with another URL already gives
is refused (collisions.py) rather than stored over the first."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from urllib.parse import unquote, urlsplit

from bulkfetch.errors import UsageError
from bulkfetch.sources.abilities import Abilities
from bulkfetch.sources.collisions import collision_reason, first_urls
from bulkfetch.sources.listed import ListedPage, ListingError

LINES_PER_PAGE = 1000


class UrlListSource:
    def __init__(self, path: str, lines_per_page: int = LINES_PER_PAGE) -> None:
        self.path = path
        self.lines_per_page = lines_per_page
        self.first_url: dict[str, str] | None = None  # collisions.first_urls(), when listing
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise UsageError(f"--from-file {path!r}: {exc.strerror}") from None

    def describe(self) -> str:
        return f"URLs listed in {self.path}"

    def abilities(self) -> Abilities:
        return Abilities()

    def list_page(self, token: str | None) -> ListedPage:
        if self.first_url is None:  # once, in the lister: workers only resolve()
            self.first_url = first_urls(self._named_lines)
        offset = int(token) if token else 0
        items: list[str] = []
        first_url = self.first_url
        try:
            with open(self.path, "rb") as handle:
                handle.seek(offset)
                while len(items) < self.lines_per_page:
                    line = handle.readline()
                    if not line:
                        return ListedPage(tuple(items), None)
                    text = line.decode("utf-8", "surrogateescape").strip()
                    if text and not text.startswith("#"):
                        if first_url:
                            text = self._unless_colliding(text, first_url)
                        items.append(text)
                following = handle.tell()
                more = handle.read(1) != b""
        except OSError as exc:
            raise ListingError(f"reading {self.path}: {exc.strerror}", retryable=False) from None
        return ListedPage(tuple(items), str(following) if more else None)

    @staticmethod
    def _unless_colliding(url: str, first_url: dict[str, str]) -> str:
        """`url`, or "url NUL reason" when its name is an earlier line's (resolve refuses)."""
        name = _name(url)
        earlier = first_url.get(name) if name is not None else None
        if earlier is None or earlier == url:
            return url
        return f"{url}\0{collision_reason(name or '', url, earlier)}"

    def _named_lines(self) -> Iterator[tuple[str, str]]:
        """(name, URL) of every line that has a name, in file order."""
        try:
            with open(self.path, "rb") as handle:
                for line in handle:
                    text = line.decode("utf-8", "surrogateescape").strip()
                    if text and not text.startswith("#"):
                        name = _name(text)
                        if name is not None:
                            yield name, text
        except OSError as exc:
            raise ListingError(f"reading {self.path}: {exc.strerror}", retryable=False) from None

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        return None  # every item is a URL to take apart

    def resolve(self, item: str) -> tuple[str, str]:
        url, refused, reason = item.partition("\0")
        if refused:
            raise ValueError(reason)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http:// or https:// URL")
        return url_name(parts.path), url


# A URL whose path needs no decoding and no cleaning: its name is the path as it stands.
# Reading a list for collisions takes this way for most lines (1 µs against 4 through
# urlsplit and unquote, which give the same name).
_PLAIN = re.compile(r"https?://[^/?#\\%\s\x00-\x1f\x7f]*/([^?#\\%\s\x00-\x1f\x7f]*)")


def _name(url: str) -> str | None:
    """The name resolve() gives a URL, None when it gives none."""
    plain = _PLAIN.fullmatch(url)
    if plain is not None:
        return plain[1].lstrip("/")
    try:
        return url_name(urlsplit(url).path)
    except ValueError:  # e.g. a broken [IPv6] host
        return None


def url_name(path: str) -> str:
    """A file's name from its URL's path alone: decoded, without the leading slash."""
    return unquote(path, errors="surrogateescape").lstrip("/")
