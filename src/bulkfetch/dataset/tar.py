"""A tar destination read back (`--sink tar`, DEST/index.sqlite): dataset.TarDataset.

Every lookup is one indexed query and one pread of the member's bytes at its recorded
offset; iteration reads the shards in the index's order (ORDER BY rowid), each shard file
opened once. Every read is checked against the MD5 in the index, since a shard can be
damaged on disk. Shard file names come from the index and are accepted only in the sink's
own `shard-WWW-NNNNNN.tar` form, opened without following symlinks, so a tampered index
cannot point a read outside DEST.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import sqlite3
import stat
from collections.abc import Iterator
from operator import itemgetter
from pathlib import Path

from bulkfetch.dataset.base import (
    FILE_FLAGS,
    Dataset,
    MemberInfo,
    OnError,
    matcher,
)
from bulkfetch.dest import index
from bulkfetch.errors import DataCorrupt, DataUnreadable, UsageError

__all__ = ["TarDataset"]

_MD5_HEX = re.compile(r"[0-9a-f]{32}")


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


# CAST: a tampered index may hold a name that is not text; it is then shown, not trusted.
_MEMBERS = ("SELECT CAST(m.name AS TEXT), m.offset, m.size, m.md5, s.file "
            "FROM members AS m LEFT JOIN shards AS s ON s.id = m.shard")
_Row = tuple[str, object, object, object, object]  # name, offset, size, md5, shard file


def _lenient_text(raw: bytes) -> str:
    # Invalid UTF-8 in the index must not abort a listing; surrogates mark it, and
    # check_name refuses such a name when it would become a path.
    return raw.decode("utf-8", "surrogateescape")


class TarDataset(Dataset):
    """Shards DEST/shard-WWW-NNNNNN.tar read through DEST/index.sqlite."""

    kind = "tar"

    def __init__(self, dest: Path) -> None:
        super().__init__(dest)
        where = dest / index.INDEX_NAME
        try:
            self._conn = index.connect(dest)
        except OSError:
            raise UsageError(f"{where} is not a readable file: is DEST a bulkfetch "
                             "destination?") from None
        except sqlite3.Error as exc:
            raise UsageError(f"{where} cannot be opened ({exc}): is DEST a bulkfetch "
                             "destination?") from None
        try:
            self._conn.text_factory = _lenient_text
            self._conn.execute("PRAGMA query_only = ON")  # a reader never changes the index
            app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
            if app_id != index.APPLICATION_ID:
                raise UsageError(f"{where} is not a bulkfetch shard index")
            self._conn.execute("SELECT name, shard, offset, size, md5 FROM members LIMIT 0")
            self._dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except sqlite3.Error as exc:
            self._conn.close()
            raise UsageError(f"{where} is not a readable bulkfetch shard index ({exc})") from None
        except BaseException:
            self._conn.close()
            raise
        self._closed = False

    @contextlib.contextmanager
    def _index_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise DataCorrupt(f"{self.dest / index.INDEX_NAME} is damaged ({exc})") from None

    def _rows(self, where: str = "", args: tuple[object, ...] = ()) -> Iterator[_Row]:
        with self._index_errors():
            yield from self._conn.execute(f"{_MEMBERS} {where}", args)

    def _row(self, name: object) -> _Row:
        if not isinstance(name, str):
            raise KeyError(name)
        try:
            row = next(self._rows("WHERE m.name = ?", (name,)), None)
        except UnicodeEncodeError:  # a lone surrogate cannot be a stored name
            row = None
        if row is None:
            raise KeyError(name)
        return row

    def items(self, pattern: str | None = None, *,
              on_error: OnError | None = None) -> Iterator[tuple[str, bytes]]:
        match = matcher(pattern)
        with _ShardReader(self._dest_fd, self.dest, sequential=True) as reader:
            for row in self._rows("ORDER BY m.rowid"):
                if not match(row[0]):
                    continue
                try:
                    body = reader.read(row)
                except DataUnreadable as exc:
                    if on_error is None:
                        raise
                    on_error(row[0], exc)
                    continue
                yield row[0], body

    def names(self, pattern: str | None = None) -> Iterator[str]:
        with self._index_errors():
            rows = self._conn.execute("SELECT CAST(name AS TEXT) FROM members ORDER BY rowid")
            # map/filter keep the per-name work in C: listings run to billions of names
            yield from filter(matcher(pattern), map(itemgetter(0), rows))

    def infos(self, pattern: str | None = None) -> Iterator[MemberInfo]:
        match = matcher(pattern)
        for row in self._rows("ORDER BY m.rowid"):
            if match(row[0]):
                yield _info(row)

    def get(self, name: str) -> bytes:
        row = self._row(name)
        with _ShardReader(self._dest_fd, self.dest, sequential=False) as reader:
            return reader.read(row)

    def info(self, name: str) -> MemberInfo:
        return _info(self._row(name))

    def __len__(self) -> int:
        with self._index_errors():
            return int(self._conn.execute("SELECT count(*) FROM members").fetchone()[0])

    def __contains__(self, name: object) -> bool:
        try:
            self._row(name)
        except KeyError:
            return False
        return True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._conn.close()
            os.close(self._dest_fd)


def _info(row: _Row) -> MemberInfo:
    name, offset, size, md5, shard = row
    return MemberInfo(name, size, md5, shard, offset)  # type: ignore[arg-type]


class _ShardReader:
    """Reads members out of one shard file at a time, switching when the shard changes, so
    iterating in index order opens each shard once and reads it front to back."""

    def __init__(self, dest_fd: int, dest: Path, *, sequential: bool) -> None:
        self._dest_fd = dest_fd
        self._dest = dest
        self._sequential = sequential
        self._file: object = None
        self._fd = -1
        self._size = 0
        self._failure: tuple[type[DataUnreadable], str] | None = None

    def __enter__(self) -> _ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _switch(self, file: object) -> None:
        """Open `file` (or remember why it cannot be), closing the previous shard."""
        self._release()
        self._file = file
        self._failure = None
        match = index.SHARD_RE.match(file) if isinstance(file, str) else None
        if match is None or match.group(3):
            self._failure = (DataCorrupt, f"the index names no valid shard file ({file!r})")
            return
        assert isinstance(file, str)
        # A running tar sink commits a shard's rows just before renaming .tar.part to .tar.
        for candidate in (file, file + ".part"):
            try:
                fd = os.open(candidate, FILE_FLAGS, dir_fd=self._dest_fd)
                break
            except FileNotFoundError:
                continue
            except OSError as exc:
                kind = DataCorrupt if exc.errno == errno.ELOOP else DataUnreadable
                self._failure = (kind, f"shard {file} cannot be opened: {exc.strerror}")
                return
        else:
            self._failure = (DataCorrupt, f"shard {file} is missing from {self._dest}")
            return
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            self._failure = (DataCorrupt, f"shard {file} is not a regular file")
            return
        if self._sequential and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self._fd, self._size = fd, info.st_size

    def read(self, row: _Row) -> bytes:
        """The member's bytes, checked against the index's bounds and MD5."""
        name, offset, size, md5, file = row
        if file != self._file or (self._fd < 0 and self._failure is None):
            self._switch(file)
        if self._failure is not None:
            kind, why = self._failure
            raise kind(f"{name!r}: {why}", name=name)
        if not (isinstance(offset, int) and isinstance(size, int) and offset >= 0
                and size >= 0 and isinstance(md5, str) and _MD5_HEX.fullmatch(md5.lower())):
            raise DataCorrupt(f"{name!r}: the index row is invalid (offset {offset!r}, size "
                              f"{size!r}, md5 {md5!r})", name=name)
        if offset + size > self._size:
            raise DataCorrupt(f"{name!r}: shard {file} has {self._size:,} bytes but the member "
                              f"ends at {offset + size:,}: the shard is truncated", name=name)
        try:
            data = _pread_exact(self._fd, size, offset)
        except OSError as exc:
            raise DataUnreadable(f"{name!r}: cannot read shard {file}: {exc.strerror}",
                                 name=name) from None
        if len(data) != size:
            raise DataCorrupt(f"{name!r}: shard {file} ended early", name=name)
        actual = _md5(data)
        if actual != md5.lower():
            raise DataCorrupt(f"{name!r}: MD5 mismatch in shard {file} at offset {offset:,}: "
                              f"the index says {md5}, the bytes hash to {actual}", name=name)
        return data


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    """`size` bytes at `offset`, or fewer at end of file. One pread unless the kernel caps a
    single read (about 2 GiB on Linux)."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    buffer = bytearray(data)
    while len(buffer) < size:
        chunk = os.pread(fd, size - len(buffer), offset + len(buffer))
        if not chunk:
            break
        buffer += chunk
    return bytes(buffer)
