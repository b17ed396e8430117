"""Serving a real directory (`--root`): relative names with "/", in sorted order, never
anything outside the root."""

from __future__ import annotations

import bisect
import os
import stat
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from bulkfetch.server.dataset import DigestCache

_READ_CHUNK = 1 << 20


@dataclass(slots=True)
class FileEntry:
    path: str
    size: int
    last_modified: int
    _key: tuple[str, int, int]  # (real path, mtime ns, size): a rewritten file is a new key
    _cache: DigestCache

    def _body(self) -> Iterator[bytes]:
        return self.read(0, self.size)

    def etag(self) -> str:
        return self._cache.digests(self._key, self._body, sha256=False).etag

    def sha256(self) -> bytes:
        digest = self._cache.digests(self._key, self._body, sha256=True).sha256
        assert digest is not None
        return digest

    def read(self, start: int, stop: int) -> Iterator[bytes]:
        with open(self.path, "rb") as handle:
            handle.seek(start)
            remaining = stop - start
            while remaining > 0:
                chunk = handle.read(min(_READ_CHUNK, remaining))
                if not chunk:
                    return
                remaining -= len(chunk)
                yield chunk


class FileTree:
    """Regular files under `root`, walked depth-first with each directory's entries sorted
    by name; a page's cursor is the last name it listed, so listing resumes by descending
    along that name. Symlinks are followed only while they stay inside the root."""

    def __init__(self, root: str, page_size: int) -> None:
        self.root = os.path.realpath(root)
        if not os.path.isdir(self.root):
            raise NotADirectoryError(root)
        self.page_size = page_size
        self.total: int | None = None
        self.identity = f"tree/{self.root}/{page_size}"
        self._etags = DigestCache(65536)
        self._listings: OrderedDict[str, tuple[int, list[str]]] = OrderedDict()

    def _inside(self, path: str) -> str | None:
        real = os.path.realpath(path)
        if real == self.root or real.startswith(self.root + os.sep):
            return real
        return None

    def _entries(self, directory: str) -> list[str]:
        """Sorted entry names of a directory, cached while its mtime holds."""
        try:
            mtime = os.stat(directory).st_mtime_ns
        except OSError:
            return []
        cached = self._listings.get(directory)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            names = []
        self._listings[directory] = (mtime, names)
        if len(self._listings) > 1024:
            self._listings.popitem(last=False)
        return names

    def _walk(self, relative_dir: str, after: list[str], seen: frozenset[str]) -> Iterator[str]:
        """Names under relative_dir that sort after the path components in `after`."""
        absolute = os.path.join(self.root, relative_dir)
        entries = self._entries(absolute)
        first = after[0] if after else None
        start = bisect.bisect_left(entries, first) if first is not None else 0
        for entry in entries[start:]:
            name = f"{relative_dir}/{entry}" if relative_dir else entry
            real = self._inside(os.path.join(self.root, name))
            if real is None:
                continue
            try:
                info = os.stat(real)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if real in seen:  # a symlink loop
                    continue
                yield from self._walk(name, after[1:] if entry == first else [], seen | {real})
            elif stat.S_ISREG(info.st_mode) and entry != first:
                yield name

    def page(self, cursor: bytes | None) -> tuple[list[str], bytes | None]:
        # surrogateescape: names that are not UTF-8 on disk must not break the cursor
        after = cursor.decode("utf-8", "surrogateescape").split("/") if cursor else []
        names: list[str] = []
        walker = self._walk("", after, frozenset({self.root}))
        for name in walker:
            names.append(name)
            if len(names) == self.page_size:
                break
        more = len(names) == self.page_size and next(walker, None) is not None
        return names, (names[-1].encode("utf-8", "surrogateescape") if more else None)

    def lookup(self, name: str) -> FileEntry | None:
        parts = name.split("/")
        if not name or any(p in ("", ".", "..") for p in parts) or "\x00" in name:
            return None
        real = self._inside(os.path.join(self.root, *parts))
        if real is None:
            return None
        try:
            info = os.stat(real)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        key = (real, info.st_mtime_ns, info.st_size)
        return FileEntry(real, info.st_size, int(info.st_mtime), key, self._etags)
