"""Reading a destination back: `open_dataset(DEST)` -> a Dataset of (name, bytes).

Two layouts, one API:

- tar (`--sink tar`, DEST/index.sqlite exists): every lookup is one indexed query and one
  pread of the member's bytes at its recorded offset; iteration reads the shards in the
  index's order (ORDER BY rowid), each shard file opened once. Every read is checked against
  the MD5 in the index, since a shard can be damaged on disk. Shard file names come from the
  index and are accepted only in the sink's own `shard-WWW-NNNNNN.tar` form, opened without
  following symlinks, so a tampered index cannot point a read outside DEST.
- directory (`--sink dir`): DEST/<name>, under `--fanout` hash levels when the journal says
  so. Paths are resolved component by component from directory fds with O_NOFOLLOW, so a
  symlink planted in DEST is never read through; symlinks, special files, DEST/.bulkfetch
  and names that check_name refuses (which the sink would never have written) are not
  members.

Memory stays flat at any number of files: queries stream from sqlite cursors, and a
directory walk holds one sorted listing per level it is in.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import os
import re
import sqlite3
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from bulkfetch import index, samples
from bulkfetch.errors import BulkfetchError, DataCorrupt, DataUnreadable, UsageError
from bulkfetch.names import RESERVED, check_name, local_parts

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

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted under a member's name must not hang; it is then refused
# by the regular-file check. It changes nothing for reading regular files.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
_MD5_HEX = re.compile(r"[0-9a-f]{32}")


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
    from bulkfetch.journal_status import read_status  # late: only directory destinations need it

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
        (see bulkfetch.samples): consecutive members with the same key are one sample."""
        return samples.group(self.items(pattern, on_error=on_error))

    def __getitem__(self, name: str) -> bytes:
        return self.get(name)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


# -- tar -------------------------------------------------------------------------------------

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
        match = _matcher(pattern)
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
            yield from filter(_matcher(pattern), map(itemgetter(0), rows))

    def infos(self, pattern: str | None = None) -> Iterator[MemberInfo]:
        match = _matcher(pattern)
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
                fd = os.open(candidate, _FILE_FLAGS, dir_fd=self._dest_fd)
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


# -- directory -------------------------------------------------------------------------------

_Walked = tuple[str, int, str]  # name, fd of its directory, the file's entry in it


class DirectoryDataset(Dataset):
    """Files under DEST as the directory sink wrote them: DEST/[fanout levels/]<name>."""

    kind = "dir"

    def __init__(self, dest: Path, fanout: int = 0) -> None:
        super().__init__(dest)
        self.fanout = fanout
        # DEST itself is the user's choice and may be reached through a symlink; below it
        # nothing is followed.
        self._root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    # -- walking: depth-first, each directory's entries sorted by name

    def _walk(self, on_error: OnError | None = None) -> Iterator[_Walked]:
        yield from self._walk_directory(self._root, (), on_error)

    def _walk_directory(self, fd: int, parts: tuple[str, ...],
                        on_error: OnError | None) -> Iterator[_Walked]:
        try:
            with os.scandir(fd) as scan:
                entries = sorted((e.name, e.is_dir(follow_symlinks=False),
                                  e.is_file(follow_symlinks=False)) for e in scan)
        except OSError as exc:
            _unreadable("/".join(parts) + "/", f"cannot list: {exc.strerror}", on_error)
            return
        for leaf, is_dir, is_file in entries:
            path = (*parts, leaf)
            if is_file:
                name = self._name_of(path)
                if name is not None:
                    yield name, fd, leaf
            elif is_dir and (parts or leaf != RESERVED):
                child = self._open_directory(fd, path, on_error)
                if child is not None:
                    try:
                        yield from self._walk_directory(child, path, on_error)
                    finally:
                        os.close(child)

    @staticmethod
    def _open_directory(parent: int, path: tuple[str, ...],
                        on_error: OnError | None) -> int | None:
        try:
            return os.open(path[-1], _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            # gone since the listing, or swapped for a symlink or a file: not a member
            if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                _unreadable("/".join(path) + "/", f"cannot open: {exc.strerror}", on_error)
            return None

    def _name_of(self, path: tuple[str, ...]) -> str | None:
        """The member name stored at `path`, or None when no name maps there."""
        if len(path) <= self.fanout:
            return None
        name = "/".join(path[self.fanout:])
        if check_name(name) is not None:
            return None
        if self.fanout and tuple(local_parts(name, self.fanout)) != path:
            return None  # not where the sink puts this name: a stray file
        return name

    # -- one member

    def _open_member(self, name: object) -> int | None:
        """A read fd for the regular file `name` names, or None when there is none."""
        if not isinstance(name, str) or check_name(name) is not None:
            return None
        parts = local_parts(name, self.fanout)
        parent = self._root
        try:
            for part in parts[:-1]:
                child = os.open(part, _DIR_FLAGS, dir_fd=parent)
                if parent != self._root:
                    os.close(parent)
                parent = child
            return _open_regular(parent, parts[-1])
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return None
            raise DataUnreadable(f"{name!r}: cannot open: {exc.strerror}", name=name) from None
        finally:
            if parent != self._root:
                os.close(parent)

    def _member_fd(self, name: object) -> int:
        fd = self._open_member(name)
        if fd is None:
            raise KeyError(name)
        return fd

    def get(self, name: str) -> bytes:
        return _read_all(self._member_fd(name), name)

    def info(self, name: str) -> MemberInfo:
        return _hashed_info(self._member_fd(name), name)

    def __contains__(self, name: object) -> bool:
        fd = self._open_member(name)
        if fd is None:
            return False
        os.close(fd)
        return True

    # -- many members

    def items(self, pattern: str | None = None, *,
              on_error: OnError | None = None) -> Iterator[tuple[str, bytes]]:
        for name, fd in self._matching_files(pattern, on_error):
            try:
                body = _read_all(fd, name)
            except DataUnreadable as exc:
                if on_error is None:
                    raise
                on_error(name, exc)
                continue
            yield name, body

    def names(self, pattern: str | None = None) -> Iterator[str]:
        yield from filter(_matcher(pattern), map(itemgetter(0), self._walk()))

    def infos(self, pattern: str | None = None) -> Iterator[MemberInfo]:
        for name, fd in self._matching_files(pattern, None):
            yield _hashed_info(fd, name)

    def _matching_files(self, pattern: str | None,
                        on_error: OnError | None) -> Iterator[tuple[str, int]]:
        """(name, open fd) of each matching regular file; the consumer closes the fd."""
        match = _matcher(pattern)
        for name, directory, leaf in self._walk(on_error):
            if not match(name):
                continue
            try:
                fd = _open_regular(directory, leaf)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ELOOP):
                    continue  # removed or swapped for a symlink since the listing
                _unreadable(name, f"cannot open: {exc.strerror}", on_error)
                continue
            if fd is not None:
                yield name, fd

    def __len__(self) -> int:
        return sum(1 for _ in self._walk())

    def close(self) -> None:
        if self._root >= 0:
            os.close(self._root)
            self._root = -1


def _unreadable(name: str, why: str, on_error: OnError | None) -> None:
    exc = DataUnreadable(f"{name!r}: {why}", name=name)
    if on_error is None:
        raise exc
    on_error(name, exc)


def _open_regular(directory: int, leaf: str) -> int | None:
    """An fd for the regular file `leaf` in `directory`, None if it is anything else.
    Raises OSError (ELOOP for a symlink, ENOENT when gone)."""
    fd = os.open(leaf, _FILE_FLAGS, dir_fd=directory)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


def _read_all(fd: int, name: str) -> bytes:
    """Everything in the file `fd` (closed afterwards)."""
    try:
        with open(fd, "rb", closefd=True) as file:
            return file.read()
    except OSError as exc:
        raise DataUnreadable(f"{name!r}: cannot read: {exc.strerror}", name=name) from None


def _hashed_info(fd: int, name: str) -> MemberInfo:
    """Size and MD5 of the file `fd` (closed afterwards), read in chunks."""
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    try:
        with open(fd, "rb", closefd=True) as file:
            while chunk := file.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise DataUnreadable(f"{name!r}: cannot read: {exc.strerror}", name=name) from None
    return MemberInfo(name, size, digest.hexdigest())
