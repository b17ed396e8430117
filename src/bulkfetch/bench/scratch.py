"""A new filesystem for each benchmark row that creates files, so every such row starts from
the same state whatever ran before it.

Why: this machine's disk is ext4 without a journal. There the inode allocator passes over
inodes freed in the last minute or more (`recently_deleted()` in fs/ext4/ialloc.c), so once
one row's 200,000 files are deleted, the next row's creates search past them: a bare create
loop measured 218-371 µs per file within 75 s of such a delete, and 21 µs after 150 s or on
a new filesystem (2026-11-22). A benchmark that deletes each row's files before the next
row would mostly measure its own deletes.

How: a sparse image file under the work directory, `mkfs.ext4` with its default features
(inode tables written at once, no reserved blocks), mounted through a loop device (needs root
and a loop device); unmounted and deleted after the row.
Where that is not possible, the row runs in a plain directory that is deleted afterwards, and
`reason` says why, for the table's header.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from bulkfetch.bench.harness import settle

_SBIN = "/usr/sbin:/sbin:/usr/bin:/bin"
_FILE_BYTES = 8192  # a 100-byte file takes one 4 KiB block and an inode; twice that is room
_SPARE_BYTES = 256 * 2**20
_SPARE_INODES = 10_000


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=_SBIN)


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise OSError(f"{os.path.basename(command[0])}: {last}")


class FreshFilesystems:
    """Hands out a new ext4, mounted at a given directory, for one row at a time."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.mkfs, self.mount, self.umount = _tool("mkfs.ext4"), _tool("mount"), _tool("umount")
        self.reason = self._unusable()

    @property
    def available(self) -> bool:
        return self.reason is None

    @property
    def note(self) -> str:
        if self.reason is None:
            return "rows that create files each on a new ext4 (loop device)"
        return (f"rows that create files on {self.work}'s filesystem ({self.reason}); "
                "their figures may include the cost of earlier rows' deletes")

    def _unusable(self) -> str | None:
        if os.geteuid() != 0:
            return "a new filesystem per row needs root"
        if not (self.mkfs and self.mount and self.umount):
            return "mkfs.ext4, mount or umount is missing (apt-get install e2fsprogs mount)"
        try:
            with self._fresh(self.work / ".probe", files=0):
                pass
        except OSError as exc:
            return f"a loop mount failed: {exc}"
        return None

    @contextlib.contextmanager
    def row(self, where: Path, files: int, file_bytes: int = 0) -> Iterator[None]:
        """A new filesystem mounted at `where` while the block runs, for a row that writes
        at most `files` files (small ones, or of `file_bytes` each) into a directory under
        it; all of it removed after."""
        if self.reason is None:
            with self._fresh(where, files, file_bytes):
                yield
            return
        where.mkdir(parents=True, exist_ok=True)
        try:
            yield
        finally:
            settle(where)

    @contextlib.contextmanager
    def _fresh(self, where: Path, files: int, file_bytes: int = 0) -> Iterator[None]:
        assert self.mkfs and self.mount and self.umount
        image = where.with_name(where.name + ".img")
        per_file = _FILE_BYTES + file_bytes * 9 // 8  # (sparse: room costs nothing)
        with open(image, "wb") as handle:
            handle.truncate(files * per_file + _SPARE_BYTES)
        mounted = False
        try:
            # Inode tables written now, not by a kernel thread while the row runs.
            _run(self.mkfs, "-q", "-F", "-m", "0", "-N", str(files + _SPARE_INODES),
                 "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image))
            where.mkdir(parents=True, exist_ok=True)
            _run(self.mount, "-o", "loop", str(image), str(where))
            mounted = True
            yield
        finally:
            if mounted:
                self._unmount(where)
            image.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                where.rmdir()

    def _unmount(self, where: Path) -> None:
        assert self.umount
        for attempt in range(20):  # a row's process may still be closing its files
            try:
                _run(self.umount, str(where))
                return
            except OSError:
                if attempt == 19:
                    raise
                time.sleep(0.25)
