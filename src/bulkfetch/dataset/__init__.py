"""Reading a destination back: `open_dataset(DEST)` -> a Dataset of (name, bytes).

Two layouts, one API: tar shards read through DEST/index.sqlite (tar.py) and a
directory as the directory sink wrote it (directory.py). Neither follows a symlink planted
in DEST or trusts what it reads: a tar member is checked against the index's MD5, a name
against check_name.

Memory stays flat at any number of files: queries stream from sqlite cursors, and a
directory walk holds one sorted listing per level it is in.
"""

from __future__ import annotations

import fnmatch
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from bulkfetch.dest import index
from bulkfetch.errors import BulkfetchError, DataUnreadable, UsageError
from bulkfetch.util import samples

__all__ = [
    "Dataset",
    "DirectoryDataset",
    "MemberInfo",
    "OnError",
    "TarDataset",
    "open_dataset",
]

# Called with (name, error) for a member that cannot be read; iteration then goes on.
OnError = Callable[[str, DataUnreadable], None]

# O_NONBLOCK: opening a FIFO planted under a member's name must not hang; it is then refused
# by the regular-file check. It changes nothing for reading regular files.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """What the destination knows about one file. `shard` (relative to DEST) and `offset` (of
    the data in the shard) are None for a directory destination."""

    name: str
    size: int
    md5: str
    shard: str | None = None
    offset: int | None = None


def open_dataset(dest: str | os.PathLike[str], *, fanout: int | None = None) -> Dataset:
    """The files `bulkfetch get` stored in DEST, whichever sink wrote them.

    `fanout` only matters for a directory destination: the number of hash-prefix levels the
    names sit under; by default it is read from DEST's journal (0 without one).
    """
    path = Path(dest)
    if not path.is_dir():
        what = "is not a directory" if os.path.lexists(path) else "does not exist"
        raise UsageError(f"{dest} {what}: give the DEST directory that bulkfetch get "
                         "downloaded into")
    if os.path.lexists(path / index.INDEX_NAME):
        return TarDataset(path)
    sink = _journal_sink(path)
    if sink.get("kind") == "tar":
        raise UsageError(f"{dest} was written by --sink tar but has no {index.INDEX_NAME} "
                         "yet (no shard has been closed): rerun the download to finish it")
    if fanout is None:
        layout = sink.get("fanout", 0)
        fanout = layout if isinstance(layout, int) and 0 <= layout <= 4 else 0
    return DirectoryDataset(path, fanout)


def _journal_sink(dest: Path) -> dict[str, object]:
    """The sink options DEST's journal recorded, or {} without a readable journal."""
    from bulkfetch.dest.journal_reader import (
        read_status,  # late: only directory destinations need it
    )

    try:
        sink = read_status(dest).fingerprint.get("sink")
    except BulkfetchError:
        return {}
    return sink if isinstance(sink, dict) else {}


def _matcher(pattern: str | None) -> Callable[[str], object]:
    """A truthy result for names matching `pattern` with fnmatch.fnmatchcase semantics (`*`
    also matches `/`), compiled once; a C callable, so that filter() stays in C."""
    if pattern is None:
        return _ANY.match
    return re.compile(fnmatch.translate(pattern)).match


_ANY = re.compile("")  # matches every name, the empty one a tampered index may hold too


class Dataset(ABC):
    """A read-only view of a destination; a mapping-like of name -> bytes."""

    kind: ClassVar[str]  # "tar" or "dir"

    def __init__(self, dest: Path) -> None:
        self.dest = dest

    @abstractmethod
    def items(self, pattern: str | None = None, *,
              on_error: OnError | None = None) -> Iterator[tuple[str, bytes]]:
        """(name, bytes) in storage order, only names matching the glob `pattern`. A member
        that cannot be read raises DataUnreadable (DataCorrupt for wrong bytes), or, with
        `on_error`, is reported there and skipped."""

    @abstractmethod
    def names(self, pattern: str | None = None) -> Iterator[str]:
        """Names in storage order, only those matching the glob `pattern`."""

    @abstractmethod
    def infos(self, pattern: str | None = None) -> Iterator[MemberInfo]:
        """MemberInfo in storage order (a directory destination reads each file for its MD5)."""

    @abstractmethod
    def get(self, name: str) -> bytes:
        """The bytes stored under `name`; KeyError when there is none."""

    @abstractmethod
    def info(self, name: str) -> MemberInfo:
        """What is known about `name`; KeyError when there is none."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, name: object) -> bool: ...

    @abstractmethod
    def close(self) -> None: ...

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        return self.items()

    def samples(self, pattern: str | None = None, *,
                on_error: OnError | None = None) -> Iterator[dict[str, str | bytes]]:
        """items() grouped into webdataset-style samples, {"__key__": key, extension: bytes}
        (see bulkfetch.util.samples): consecutive members with the same key are one sample."""
        return samples.group(self.items(pattern, on_error=on_error))

    def __getitem__(self, name: str) -> bytes:
        return self.get(name)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# The two layouts (they subclass Dataset above, so they load after it).
from bulkfetch.dataset.directory import DirectoryDataset  # noqa: E402
from bulkfetch.dataset.tar import TarDataset  # noqa: E402
