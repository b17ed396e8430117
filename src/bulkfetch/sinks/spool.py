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
# A spool whose file is fsynced before it is stored (the dir sink's fsync option) asks the
# kernel to start writing it back every WRITEBACK_EVERY bytes, so the disk works while the
# network does and the last fsync waits for a tail, not the whole file: a 629 MB pull took
# 4.7 s with the fsync at the end and 2.6 s without any (session 17).
WRITEBACK_EVERY = 16 << 20
_SYNC_FILE_RANGE_WRITE = 2


def _writeback_starter() -> object:
    """sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) from libc, or None where there is
    none (the fsync at the end then does all the waiting)."""
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_start_writeback: object = None  # looked up at the first spool that asks for it


class FileSpool:
    """A new temporary file `name` in the directory `dir_fd`, written in arrival order.
    `where` names that directory in messages."""

    __slots__ = ("behind", "dir_fd", "fd", "name", "where")

    def __init__(self, dir_fd: int, name: str, where: str, reopen: bool = False,
                 writeback: bool = False) -> None:
        """`reopen`: open the file when it exists (a partial file a rerun resumes);
        `writeback`: start writing it back as it grows (see WRITEBACK_EVERY)."""
        global _start_writeback
        self.dir_fd = dir_fd
        self.name = name
        self.where = where
        self.behind = -1  # bytes written since writeback was last started; -1: never
        if writeback:
            if _start_writeback is None:
                _start_writeback = _writeback_starter() or False
            if _start_writeback:
                self.behind = 0
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
        if self.behind >= 0:
            self._written(len(data))

    def _written(self, size: int) -> None:
        self.behind += size
        if self.behind >= WRITEBACK_EVERY:
            self.behind = 0
            _start_writeback(self.fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # type: ignore[operator]

    def write_at(self, data: bytes, offset: int) -> None:
        """Write `data` at `offset` (a part of a file fetched in ranges)."""
        try:
            written = os.pwrite(self.fd, data, offset)
            while written < len(data):
                written += os.pwrite(self.fd, memoryview(data)[written:], offset + written)
        except OSError as exc:
            raise fatal_or_failure(exc, f"cannot write a temporary file in {self.where}") from None
        if self.behind >= 0:
            self._written(len(data))

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

    def open(self, name: str, reopen: bool = False, writeback: bool = False) -> FileSpool:
        """A new spool `name` in the directory (`reopen`: the existing one, if any)."""
        if self.fd < 0:
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.relative, 0o755, dir_fd=self.dest_fd)
                self.fd = os.open(self.relative, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                  | os.O_CLOEXEC, dir_fd=self.dest_fd)
            except OSError as exc:
                raise fatal_or_failure(exc, f"cannot open {self.where}") from None
        return FileSpool(self.fd, name, self.where, reopen, writeback)

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


class MemorySpool:
    """Keeps the body in memory: for sinks that hand bodies to a Python caller, who asked
    for bytes whatever their size (the Client, bulkfetch.stream)."""

    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(bytes(data))

    def body(self) -> bytes:
        return b"".join(self.chunks)

    def discard(self) -> None:
        self.chunks.clear()
