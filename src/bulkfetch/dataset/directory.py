"""A directory destination read back (`--sink dir`): dataset.DirectoryDataset.

DEST/<name>, under `--fanout` hash levels when the journal says so. Paths are resolved
component by component from directory fds with O_NOFOLLOW, so a symlink planted in DEST is
never read through; symlinks, special files, DEST/.bulkfetch and names that check_name
refuses (which the sink would never have written) are not members.
"""

from __future__ import annotations

import errno
import hashlib
import os
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
from bulkfetch.errors import DataUnreadable
from bulkfetch.util.names import RESERVED, check_name, local_parts

__all__ = ["DirectoryDataset"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20  # read size when a member is hashed (ls -l)
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
        yield from filter(matcher(pattern), map(itemgetter(0), self._walk()))

    def infos(self, pattern: str | None = None) -> Iterator[MemberInfo]:
        for name, fd in self._matching_files(pattern, None):
            yield _hashed_info(fd, name)

    def _matching_files(self, pattern: str | None,
                        on_error: OnError | None) -> Iterator[tuple[str, int]]:
        """(name, open fd) of each matching regular file; the consumer closes the fd."""
        match = matcher(pattern)
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
    fd = os.open(leaf, FILE_FLAGS, dir_fd=directory)
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
