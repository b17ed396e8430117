"""Spools: where a body too big for memory goes while it arrives.

The fetcher streams such a body into a Spool chunk by chunk (hashing it on the way) and,
once it is complete and verified, hands the spool to its sink's store_spool(). The dir and
tar sinks spool into a temporary file under DEST/.bulkfetch/tmp (dir renames it into place;
tar copies it into the shard in the kernel); the null sink keeps nothing.
"""

from __future__ import annotations

import contextlib
import os

from bulkfetch.sinks.base import fatal_or_failure

PARTIAL_DIR = ".bulkfetch/partial"  # see engine/resume.py

_SPOOL_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class FileSpool:
    """A new temporary file `name` in the directory `dir_fd`, written in arrival order.
    `where` names that directory in messages."""

    __slots__ = ("dir_fd", "fd", "name", "where")

    def __init__(self, dir_fd: int, name: str, where: str, reopen: bool = False) -> None:
        """`reopen`: open the file when it exists (a partial file a rerun resumes)."""
        self.dir_fd = dir_fd
        self.name = name
        self.where = where
        flags = _SPOOL_FLAGS & ~os.O_EXCL if reopen else _SPOOL_FLAGS
        try:
            self.fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            raise fatal_or_failure(exc, f"cannot create a temporary file in {where}") from None

    def write(self, data: bytes) -> None:
        try:
            written = os.write(self.fd, data)
            if written < len(data):
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(self.fd, view):]
        except OSError as exc:
            raise fatal_or_failure(exc, f"cannot write a temporary file in {self.where}") from None

    def write_at(self, data: bytes, offset: int) -> None:
        """Write `data` at `offset` (a part of a file fetched in ranges)."""
        try:
            written = os.pwrite(self.fd, data, offset)
            while written < len(data):
                written += os.pwrite(self.fd, memoryview(data)[written:], offset + written)
        except OSError as exc:
            raise fatal_or_failure(exc, f"cannot write a temporary file in {self.where}") from None

    def close(self) -> None:
        """Close the file, keeping it (its name is then renamed or copied away)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def discard(self) -> None:
        self.close()
        with contextlib.suppress(OSError):
            os.unlink(self.name, dir_fd=self.dir_fd)


class SpoolDirectory:
    """A directory of DEST (`relative`, e.g. TMP_DIR or PARTIAL_DIR) that spools live in,
    created and opened at the first spool: most runs never need one."""

    def __init__(self, dest_fd: int, relative: str, where: str) -> None:
        self.dest_fd = dest_fd
        self.relative = relative
        self.where = where  # its path, for messages
        self.fd = -1

    def open(self, name: str, reopen: bool = False) -> FileSpool:
        """A new spool `name` in the directory (`reopen`: the existing one, if any)."""
        if self.fd < 0:
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.relative, 0o755, dir_fd=self.dest_fd)
                self.fd = os.open(self.relative, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                  | os.O_CLOEXEC, dir_fd=self.dest_fd)
            except OSError as exc:
                raise fatal_or_failure(exc, f"cannot open {self.where}") from None
        return FileSpool(self.fd, name, self.where, reopen)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class NullSpool:
    """Keeps nothing: for the null sink, which verifies and discards."""

    __slots__ = ()

    def write(self, data: bytes) -> None:
        pass

    def discard(self) -> None:
        pass
