"""DEST/.bulkfetch/lock: one run at a time per DEST.

An exclusive flock(2) held for the whole run, with the holder's pid written in the file so a
second run (DestBusy) and `bulkfetch status` can name it. The lock's fd is closed in forked
children (os.register_at_fork), so an orphaned worker cannot keep DEST locked; a run killed
outright releases it with its last fd, leaving nothing to clean up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from bulkfetch.errors import DestBusy

__all__ = ["LOCK_NAME", "lock_dest", "lock_holder", "unlock_dest"]

LOCK_NAME = "lock"
_LOCK_TRIES = 5  # a `status` probe holds the lock shared for microseconds: retry briefly

_LOCK_FDS: set[int] = set()


def _close_locks_in_child() -> None:
    for fd in _LOCK_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCK_FDS.clear()


os.register_at_fork(after_in_child=_close_locks_in_child)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def lock_dest(dest: Path, path: Path) -> int:
    """An fd holding DEST's lock exclusively, with this pid written in it; DestBusy naming
    the holder's pid when another run has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    for attempt in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == _LOCK_TRIES - 1:
                pid = _read_pid(fd)
                os.close(fd)
                who = f"pid {pid}" if pid else "pid unknown"
                raise DestBusy(f"{dest} is in use by another bulkfetch run ({who}): wait for "
                               "it to finish or stop it, or choose another DEST",
                               dest=dest, pid=pid) from None
            time.sleep(0.02)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _LOCK_FDS.add(fd)
    return fd


def unlock_dest(fd: int) -> None:
    if fd in _LOCK_FDS:  # not already closed by a fork handler (or by us)
        _LOCK_FDS.discard(fd)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # releases the flock


def lock_holder(path: Path) -> tuple[bool, int | None]:
    """(held, pid) without disturbing a run: a shared non-blocking probe, released at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False, None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, _read_pid(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False, None
    finally:
        os.close(fd)
