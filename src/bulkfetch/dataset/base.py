"""What every layout of a destination read back has: the Dataset interface (a read-only
mapping of name -> bytes), what is known of one member (MemberInfo), and the helpers the
layouts share (glob matching in C, the flags every member file is opened with)."""

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

from bulkfetch.errors import DataUnreadable
from bulkfetch.util import samples

# Called with (name, error) for a member that cannot be read; iteration then goes on.
OnError = Callable[[str, DataUnreadable], None]

# O_NONBLOCK: opening a FIFO planted under a member's name must not hang; it is then refused
# by the regular-file check. It changes nothing for reading regular files.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """What the destination knows about one file. `shard` (relative to DEST) and `offset` (of
    the data in the shard) are None for a directory destination."""

    name: str
    size: int
    md5: str
    shard: str | None = None
    offset: int | None = None


def matcher(pattern: str | None) -> Callable[[str], object]:
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
