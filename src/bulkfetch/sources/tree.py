"""A source listed as a tree of directories (a web server's directory listings): what one
directory holds (DirPage), how its requests are made and read (TreeSource), and the pages
and tokens a directory becomes.

A directory becomes one page of its files, or several of at most PAGE_FILES each. A page's
token names the directory and the part (`tree:["a/b/",0]`); the first part's next token
names the subdirectories the directory holds and how many parts it has, so a journal of
the pages listed also holds every directory found: a rerun lists only the directories no
journaled page names (listing/tree_lister.py), and a page not done is listed again from its
directory alone. No next token is None: a tree's listing ends when no directory is left.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bulkfetch.sources.listed import ListedPage

if TYPE_CHECKING:
    import pycurl

    from bulkfetch.sources.listed import ListingError

PAGE_FILES = 1000  # files a page holds at most: a directory of more is several pages
_PREFIX = "tree:"
REFUSED = "\0\0"  # an item "path NUL NUL reason": a directory that could not be listed


@dataclass(frozen=True, slots=True)
class DirPage:
    """One directory as listed: its files (paths from the top, as items), their sizes (-1
    where the listing gives none or only an estimate), and its subdirectories (paths from
    the top, ending in '/')."""

    files: tuple[str, ...]
    sizes: tuple[int, ...]
    dirs: tuple[str, ...]
    estimated: int = 0  # files whose listed size was rounded, so not checked
    mtimes: tuple[int, ...] | None = None  # the files' (Unix seconds, -1 unknown)
    sums: tuple[str, ...] = ()  # its checksum files (SHA256SUMS, MD5SUMS), among `files`
    # the files' digests those give: an MD5's hex, "sha256:" and a SHA-256's, "" unknown
    digests: tuple[str, ...] | None = None


class TreeSource(Protocol):
    """What listing/tree_lister.py needs of a tree: requests it carries on one curl multi,
    answers it hands back to be read."""

    def list_handle(self) -> pycurl.Curl:
        """A new handle with everything a directory request needs but its URL."""
        ...

    def dir_url(self, path: str) -> str:
        """The URL of directory `path` ("" the top; else ends in '/')."""
        ...

    def dir_page(self, path: str, status: int, headers: list[bytes], body: bytes,
                 url: str) -> DirPage:
        """Directory `path` in an answer from `url` (after redirects). Raises ListingError."""
        ...

    def transfer_error(self, code: int, message: str, url: str) -> ListingError: ...

    def max_depth(self) -> int | None:
        """How many levels below the top are listed (None: all)."""
        ...

    def file_url(self, item: str) -> str:
        """The URL of a listed file (a checksum file, read by the lister)."""
        ...

    def read_sums(self, item: str, status: int, body: bytes) -> dict[str, str]:
        """item -> digest (as DirPage.digests) of the files checksum file `item` names in
        its own directory; {} for an answer that is not one."""
        ...


def token(path: str, part: int) -> str:
    """The token of part `part` of directory `path`'s files. ASCII (a name's bytes that are
    not UTF-8 are escaped), so any journal keeps it as it is."""
    return _PREFIX + json.dumps([path, part])


def parse_token(text: str | None) -> tuple[str, int]:
    """(directory, part) of a token; None is the top's first page. ValueError otherwise."""
    if text is None:
        return "", 0
    if not text.startswith(_PREFIX):
        raise ValueError(f"not a directory tree's token: {text[:60]!r}")
    path, part = json.loads(text[len(_PREFIX):])
    if not isinstance(path, str) or not isinstance(part, int) or part < 0:
        raise ValueError(f"not a directory tree's token: {text[:60]!r}")
    return path, part


def next_token(dirs: Sequence[str], parts: int) -> str:
    """The next token of a directory's first page: its subdirectories and number of parts."""
    return json.dumps({"dirs": list(dirs), "parts": parts})


LATER_PART = json.dumps({})  # the next token of a directory's later parts: nothing new


def parse_next(text: str | None) -> tuple[tuple[str, ...], int]:
    """(subdirectories, parts) a first page's next token names; ((), 0) for a later part."""
    found = json.loads(text) if text else {}
    return tuple(found.get("dirs", ())), int(found.get("parts", 0))


def depth(path: str) -> int:
    """Levels below the top: "" 0, "a/" 1, "a/b/" 2."""
    return path.count("/")


def parts_of(files: Sequence[str], key_of: Callable[[str], str] | None = None
             ) -> list[tuple[int, int]]:
    """(start, end) of each page of a directory's files: PAGE_FILES at most, and with
    `key_of` (a tar's samples) a sample is never cut, so a page may hold a little more."""
    cuts, start, count = [], 0, len(files)
    while start < count or not cuts:
        end = min(start + PAGE_FILES, count)
        if key_of is not None:
            while 0 < end < count and key_of(files[end]) == key_of(files[end - 1]):
                end += 1
        cuts.append((start, end))
        start = end
    return cuts


def pages_of(path: str, page: DirPage, key_of: Callable[[str], str] | None = None
             ) -> list[tuple[str, ListedPage]]:
    """(token, page) of each part of directory `path`'s files, in order."""
    cuts = parts_of(page.files, key_of)
    known = any(size >= 0 for size in page.sizes)
    mtimes = page.mtimes if page.mtimes is not None and any(
        mtime >= 0 for mtime in page.mtimes) else None
    digests = page.digests if page.digests is not None and any(page.digests) else None
    return [(token(path, part), ListedPage(
        page.files[start:end], next_token(page.dirs, len(cuts)) if part == 0 else LATER_PART,
        sizes=page.sizes[start:end] if known or digests is not None else None,
        md5s=digests[start:end] if digests is not None else None,
        mtimes=mtimes[start:end] if mtimes is not None else None,
        estimated=page.estimated if part == 0 else 0))
        for part, (start, end) in enumerate(cuts)]


def refused_page(path: str, reason: str) -> ListedPage:
    """The page of a directory that could not be listed (gone, forbidden): one item, the
    directory, that resolve() refuses with `reason`: a failure the report names."""
    return ListedPage((path + REFUSED + reason,), next_token((), 1))
