"""DEST/<name>: one file per name, written under a temporary name and renamed into place.

Every path is resolved component by component with O_NOFOLLOW relative to directory file
descriptors, so a symlink planted inside DEST is never written through and nothing is ever
created outside DEST. Temporary files live in DEST/.bulkfetch/tmp, emptied at each start.
(O_TMPFILE + linkat(2) would spare the temporary name: on a new ext4 here it took 23.2-29.4
against 24.2-33.9 µs per 100-byte file for the temporary file and rename, a saving within the
noise; 2026-11-22. Earlier figures of 240-460 µs were taken right after mass deletes. And
linkat(2) cannot replace a file, as a rerun must when an interrupted page left one.)

The MD5 of every file written (the fetcher computes it to verify the body) is appended, a
page at a time, to DEST/.bulkfetch/sums/<worker>.md5 as md5sum lines of its path under
DEST: `bulkfetch hash --dest DEST` re-verifies against them, and so does
`cd DEST && cat .bulkfetch/sums/*.md5 | md5sum -c`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from bulkfetch.dest.sums import SUMS_DIR, has_sums
from bulkfetch.dest.validators import COMPANION, validator_lines
from bulkfetch.models import PageReport
from bulkfetch.sinks.base import SinkAbilities, SinkFailure, SinkFatal, Writer, fatal_or_failure
from bulkfetch.sinks.spool import PARTIAL_DIR, FileSpool, SpoolDirectory
from bulkfetch.util.checksum_lines import sum_lines
from bulkfetch.util.md5 import md5_hex
from bulkfetch.util.names import local_parts

TMP_DIR = ".bulkfetch/tmp"


def worker_tmp_name(worker: int) -> str:
    """A worker's own directory under TMP_DIR (what a lost worker leaves is removed by it)."""
    return f"w{worker}"


def fence(dest: Path, worker: int) -> None:
    """Remove the temporary directory of a worker given up for lost, so that it stores
    nothing more if it wakes (a Ray actor on a node cut off): each file is created there
    first, and a removed directory takes no new entry, not even through the descriptor the
    worker holds. Raises OSError if the directory stays."""
    path = dest / TMP_DIR / worker_tmp_name(worker)
    for _ in range(10):  # a file it created meanwhile fails the last rmdir: again
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
    raise OSError(errno.ENOTEMPTY, f"cannot remove {path}")


FENCED = ("this worker was given up for lost (its temporary directory was removed): its "
          "pages went to other workers, and it stores nothing more")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIRS = 256


class DirectorySink:
    abilities = SinkAbilities(resumes=True)

    def __init__(self, dest: Path, worker: int, fanout: int = 0, fsync: bool = False) -> None:
        self.dest = dest
        # md5sum lines are written for the bodies that were hashed. Into a DEST whose earlier
        # runs recorded some, every body is (even under --no-verify): a file stored again
        # without a line would leave its older line, now untrue, the latest (dest/sums.py).
        self.needs_md5 = has_sums(dest)
        self.fanout = fanout
        # Each file's data on disk before its rename (`pull`: a blob in place is a blob
        # whole); a plain get leaves write-back to the kernel (see end_page).
        self.fsync = fsync
        self.prefix = f"w{worker}-{os.getpid()}-"
        self.counter = 0
        self.dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # One temporary directory per worker: workers sharing one directory contend for its
        # lock (two workers on one core wrote 2,840 files/s shared, 4,008 apart).
        self.shared_tmp_fd = os.open(TMP_DIR, _DIR_FLAGS, dir_fd=self.dest_fd)
        self.tmp_name = worker_tmp_name(worker)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.tmp_name, 0o755, dir_fd=self.shared_tmp_fd)
        self.tmp_fd = os.open(self.tmp_name, _DIR_FLAGS, dir_fd=self.shared_tmp_fd)
        self.dirs: OrderedDict[tuple[str, ...], int] = OrderedDict()
        self.partials = SpoolDirectory(self.dest_fd, PARTIAL_DIR, str(dest / PARTIAL_DIR))
        self.sums: list[tuple[str, str]] = []  # (name, MD5) written since the last page end
        self.sums_name = f"w{worker}-{os.getpid()}.md5"
        self.sums_fd = -1
        # (name, ETag, Last-Modified) of those whose ETag was not their MD5
        self.validators: list[tuple[str, str, str]] = []
        self.validators_fd = -1
        # get --sync: names whose conditional request was answered 200 (their body comes
        # next), and those bodies found equal to the file DEST holds (left as they were)
        self.answered_whole: set[str] = set()
        self.same_bodies = 0

    def _directory(self, parts: tuple[str, ...]) -> int:
        """An fd for DEST/parts, creating directories as needed, never following symlinks."""
        if not parts:
            return self.dest_fd
        fd = self.dirs.get(parts)
        if fd is not None:
            self.dirs.move_to_end(parts)
            return fd
        parent = self._directory(parts[:-1])
        leaf = parts[-1]
        try:
            fd = os.open(leaf, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            try:
                os.mkdir(leaf, 0o755, dir_fd=parent)
            except FileExistsError:
                pass  # another worker made it meanwhile
            except OSError as exc:
                raise fatal_or_failure(exc, f"cannot create directory {'/'.join(parts)}") from None
            fd = self._open_existing(parts, parent)
        except OSError as exc:
            raise self._not_a_directory(exc, parts) from None
        self.dirs[parts] = fd
        if len(self.dirs) > _OPEN_DIRS:
            _, old = self.dirs.popitem(last=False)
            os.close(old)
        return fd

    def _open_existing(self, parts: tuple[str, ...], parent: int) -> int:
        try:
            return os.open(parts[-1], _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise self._not_a_directory(exc, parts) from None

    @staticmethod
    def _not_a_directory(exc: OSError, parts: tuple[str, ...]) -> Exception:
        where = "/".join(parts)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return SinkFailure(f"{where} is a symlink or a file, not a directory")
        return fatal_or_failure(exc, f"cannot open directory {where}")

    def begin_page(self, seq: int, names: Sequence[str] = ()) -> Writer:
        return self.write

    def skip(self, seq: int, name: str) -> None:
        pass  # each file is published on its own

    def write(self, name: str, body: bytes, md5: str | None = None) -> None:
        # Runs once per file: a body taken by one write(2) (any small one) skips the
        # memoryview loop.
        if self.answered_whole and name in self.answered_whole:
            self.answered_whole.discard(name)
            if self._holds(name, body):  # the server ignored the conditional request
                self.same_bodies += 1
                if md5 is None and self.needs_md5:
                    md5 = md5_hex(body)
                if md5 is not None:
                    self.sums.append((name, md5))  # (its line, again: with its validators)
                return
        self.counter += 1
        temporary = self.prefix + str(self.counter)
        try:
            fd = os.open(temporary, _FILE_FLAGS, 0o644, dir_fd=self.tmp_fd)
        except OSError as exc:
            if self._fenced():
                raise SinkFatal(FENCED) from None
            raise fatal_or_failure(
                exc, f"cannot create a temporary file in {self.dest / TMP_DIR}") from None
        try:
            try:
                written = os.write(fd, body)
                if written < len(body):
                    view = memoryview(body)[written:]
                    while view:
                        view = view[os.write(fd, view):]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            self._discard(temporary, self.tmp_fd)
            raise fatal_or_failure(exc, f"cannot write {name} into {self.dest}") from None
        self._publish(name, temporary, self.tmp_fd)
        if md5 is None and self.needs_md5:
            md5 = md5_hex(body)
        if md5 is not None:
            self.sums.append((name, md5))

    def keep_validators(self, name: str, etag: str, modified: str) -> None:
        """The ETag or Last-Modified of the 200 whose body `name` was just written (one
        whose ETag was not its MD5), kept beside its sums line for get --sync."""
        self.validators.append((name, etag, modified))

    # -- get --sync: a page whose requests are conditional (runners/sync.py) ---------------
    def response_headers(self, name: str, lines: list[bytes]) -> None:
        """A 200 to a conditional request: the body that follows replaces the file, unless
        it is the file's own bytes (a server that ignores conditional requests): then the
        file stays as it is, same inode and mtime, as after a 304."""
        self.answered_whole.add(name)

    def _holds(self, name: str, body: bytes) -> bool:
        """Whether DEST's regular file `name` holds exactly `body` (read through the same
        descriptors as a write: never through a symlink)."""
        try:
            parent, leaf = self._place(name)
            fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except (OSError, SinkFailure, SinkFatal):
            return False
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_size != len(body):
                return False
            held = bytearray()
            while len(held) < len(body) and (chunk := os.read(fd, len(body) - len(held))):
                held += chunk
            return held == body
        except OSError:
            return False
        finally:
            os.close(fd)

    def not_modified(self, name: str, lines: list[bytes]) -> None:
        """A 304: DEST's file is the source's; it stays as it is (same inode, same mtime),
        if it is still there."""
        path = self.dest.joinpath(*local_parts(name, self.fanout))
        try:
            found = os.lstat(path)
        except OSError:
            found = None
        if found is None or not stat.S_ISREG(found.st_mode):
            raise SinkFailure(f"{name} left DEST during the sync (the server says it is "
                              "unchanged): run the sync again")

    def open_spool(self, name: str) -> FileSpool:
        self.counter += 1
        return FileSpool(self.tmp_fd, self.prefix + str(self.counter), str(self.dest / TMP_DIR),
                         writeback=self.fsync)

    def open_partial(self, key: str) -> FileSpool:
        return self.partials.open(key, reopen=True, writeback=self.fsync)

    def store_spool(self, seq: int, name: str, spool: FileSpool, size: int, md5: str) -> None:
        try:
            if self.fsync:
                os.fsync(spool.fd)
            spool.close()
        except OSError as exc:
            spool.discard()
            raise fatal_or_failure(exc, f"cannot write {name} into {self.dest}") from None
        self._publish(name, spool.name, spool.dir_fd)
        if md5:  # "" when nobody hashed it with MD5 (a pinned body: digests.NoMd5)
            self.sums.append((name, md5))

    def _publish(self, name: str, temporary: str, source: int) -> None:
        """Rename the complete file `temporary` in the directory `source` into place as
        `name`, or remove it."""
        try:
            if source != self.tmp_fd and self._fenced():  # (the partial files' directory)
                raise SinkFatal(FENCED)
            parent, leaf = self._place(name)
            os.rename(temporary, leaf, src_dir_fd=source, dst_dir_fd=parent)
        except OSError as exc:
            self._discard(temporary, source)
            if self._fenced():
                raise SinkFatal(FENCED) from None
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise SinkFailure(f"a directory is in the way of {name}") from None
            raise fatal_or_failure(exc, f"cannot write {name} into {self.dest}") from None
        except BaseException:  # a SinkFailure for the directories on the way
            self._discard(temporary, source)
            raise

    def _fenced(self) -> bool:
        """Whether the coordinator removed this worker's temporary directory (fence())."""
        try:
            return os.fstat(self.tmp_fd).st_nlink == 0
        except OSError:  # a stale handle (NFS): removed by another host
            return True

    def _place(self, name: str) -> tuple[int, str]:
        """(an fd of the directory `name` goes in, made as needed; its last component). A
        name directly under DEST (the usual case) skips the path split."""
        if self.fanout or "/" in name:
            parts = local_parts(name, self.fanout)
            return self._directory(tuple(parts[:-1])), parts[-1]
        return self.dest_fd, name

    def _discard(self, temporary: str, source: int) -> None:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=source)

    def end_page(self, report: PageReport) -> list[PageReport]:
        """Files are renamed into place as they complete, so the page is done at once.
        That survives a killed process; surviving power loss would need an fsync per file."""
        if self.sums:
            self._record_sums()
        for failure in report.failures:  # (a 200 whose body failed its checks)
            self.answered_whole.discard(failure.name)
        return [report]

    def _record_sums(self) -> None:
        """Append the md5sum lines of the files written since the last call, and their
        validators (dest/validators.py) to the companion file, written first: a line there
        holds only beside its sums line."""
        fanout = self.fanout

        def path(name: str) -> str:
            return "/".join(local_parts(name, fanout)) if fanout or "/" in name else name

        lines = sum_lines([(md5, path(name)) for name, md5 in self.sums])
        self.sums.clear()
        if self.validators:
            kept = validator_lines([(path(name), etag, modified)
                                    for name, etag, modified in self.validators])
            self.validators.clear()
            self.validators_fd = self._append(self.validators_fd,
                                              self.sums_name[:-4] + COMPANION, kept)
        self.sums_fd = self._append(self.sums_fd, self.sums_name, lines)

    def _append(self, fd: int, name: str, data: bytes) -> int:
        """Append `data` to DEST/.bulkfetch/sums/`name` (opened when `fd` is -1); its fd."""
        try:
            if fd < 0:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(SUMS_DIR, 0o755, dir_fd=self.dest_fd)
                directory = os.open(SUMS_DIR, _DIR_FLAGS, dir_fd=self.dest_fd)
                try:
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o644, dir_fd=directory)
                finally:
                    os.close(directory)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            raise SinkFatal(f"cannot record checksums in {self.dest / SUMS_DIR / name}: "
                            f"{exc.strerror}") from None
        return fd

    def ready(self) -> list[PageReport]:
        return []

    def flush(self) -> list[PageReport]:
        return []

    def close(self) -> None:
        for fd in (self.sums_fd, self.validators_fd):
            if fd >= 0:
                os.close(fd)
        self.sums_fd = self.validators_fd = -1
        for fd in self.dirs.values():
            os.close(fd)
        self.dirs.clear()
        self.partials.close()
        os.close(self.tmp_fd)
        with contextlib.suppress(OSError):  # empty unless a write was cut short
            os.rmdir(self.tmp_name, dir_fd=self.shared_tmp_fd)
        os.close(self.shared_tmp_fd)
        os.close(self.dest_fd)
