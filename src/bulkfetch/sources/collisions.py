"""Names that two different URLs of one list share (`--from-file URLS.txt` names a file by
its URL's path, so `http://a/img/1.jpg` and `http://b/img/1.jpg` are both `img/1.jpg`).

Storing both would overwrite one with the other, silently. So before the first page, the
list is read through once for the names' hashes, which go to temporary partition files
(8 bytes a line on disk, never all in memory); a partition at a time is sorted to find the
hashes seen twice. Only if there are any, a second read takes the first URL of each such
name. Every later line naming it with another URL is a collision: a failure of its own that
names both URLs (the same URL twice is no collision). File order decides which URL is
first, so a resumed run decides the same.
"""

from __future__ import annotations

import array
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator

PARTITIONS = 64
FLUSH_AT = 8192  # hashes a partition holds in memory before they go to its file

# (name, URL) of every line, in file order
Rows = Callable[[], Iterable[tuple[str, str]]]


def first_urls(rows: Rows) -> dict[str, str]:
    """{name: the URL that names it first} of every name that more than one line gives: a
    later line with another URL collides. Memory holds only these names."""
    repeated = _repeated_hashes(rows)
    if not repeated:
        return {}
    first: dict[str, str] = {}
    for name, url in rows():
        if hash(name) in repeated:
            first.setdefault(name, url)
    return first


def _repeated_hashes(rows: Rows) -> set[int]:
    """Hashes of names on two lines or more (hash() is stable within this process)."""
    with tempfile.TemporaryDirectory(prefix="bulkfetch-names-") as work:
        paths = [os.path.join(work, str(i)) for i in range(PARTITIONS)]
        buffers = [array.array("q") for _ in range(PARTITIONS)]
        files = [open(path, "wb") for path in paths]  # noqa: SIM115 - closed below
        try:
            for name, _ in rows():
                code = hash(name)
                buffer = buffers[code % PARTITIONS]
                buffer.append(code)
                if len(buffer) >= FLUSH_AT:
                    buffer.tofile(files[code % PARTITIONS])
                    del buffer[:]
            for buffer, handle in zip(buffers, files, strict=True):
                buffer.tofile(handle)
        finally:
            for handle in files:
                handle.close()
        repeated: set[int] = set()
        for path in paths:
            repeated.update(_twice(path))
        return repeated


def _twice(path: str) -> Iterator[int]:
    codes = array.array("q")
    with open(path, "rb") as handle:
        codes.frombytes(handle.read())
    previous = None
    for code in sorted(codes):
        if code == previous:
            yield code
        previous = code


def collision_reason(name: str, url: str, first_url: str) -> str:
    return (f"name collision: {url} would be stored as {name!r}, which {first_url} (listed "
            "earlier) already names; give the URLs as a table with --name-col or "
            "--name-template to keep both")
