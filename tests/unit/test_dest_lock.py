"""dest/lock.py: one run a DEST. A second holder is refused naming the first's pid, a
holder gone within the retries is waited for, an unlocked DEST is free at once, and a
forked child never keeps the lock."""

from __future__ import annotations

import fcntl
import os
import stat
import time
from pathlib import Path

import pytest

from bulkfetch.dest import lock
from bulkfetch.dest.lock import lock_dest, lock_holder, unlock_dest
from bulkfetch.errors import DestBusy


def test_the_holder_writes_its_pid_over_whatever_the_file_held(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    path.write_text("123456789012345678\n")  # longer than a pid: must not show through
    fd = lock_dest(tmp_path, path)
    mask = os.umask(0)
    os.umask(mask)  # (only read)
    try:
        fresh = lock_dest(tmp_path / "d", tmp_path / "fresh")
        unlock_dest(fresh)
        assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o644 & ~mask
        assert path.read_text() == f"{os.getpid()}\n"
        assert lock_holder(path) == (True, os.getpid())
    finally:
        unlock_dest(fd)
    assert lock_holder(path) == (False, None)
    assert path.read_text() == ""  # no stale pid for `status` to name


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_second_run_is_refused_naming_the_first(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(lock.time, "sleep", slept.append)
    path = tmp_path / "lock"
    fd = lock_dest(tmp_path, path)
    before = open_fds()
    try:
        with pytest.raises(DestBusy, match=f"in use by another bulkfetch run \\(pid "
                                           f"{os.getpid()}\\)") as busy:
            lock_dest(tmp_path, path)
        assert busy.value.pid == os.getpid()
        assert len(slept) == lock._LOCK_TRIES - 1  # tried again, briefly, then refused
        assert lock_holder(path) == (True, os.getpid())  # the first still holds it
        assert open_fds() == before  # neither the refused try nor the probe kept an fd
    finally:
        unlock_dest(fd)


def test_a_holder_without_a_pid_is_named_unknown(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock.time, "sleep", lambda _: None)
    path = tmp_path / "lock"
    other = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)  # a holder that wrote nothing yet
    try:
        with pytest.raises(DestBusy, match=r"\(pid unknown\)"):
            lock_dest(tmp_path, path)
    finally:
        os.close(other)


def test_a_holder_gone_within_the_retries_is_waited_for(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "lock"
    other = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the holder lets go during the last pause
        slept.append(seconds)
        if len(slept) == lock._LOCK_TRIES - 1:
            os.close(other)

    monkeypatch.setattr(lock.time, "sleep", sleep)
    fd = lock_dest(tmp_path, path)
    unlock_dest(fd)
    assert len(slept) == lock._LOCK_TRIES - 1 and all(0 < s < 0.1 for s in slept)


def test_unlocked_means_free_and_unlocking_twice_is_harmless(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    for _ in range(2):
        fd = lock_dest(tmp_path, path)
        unlock_dest(fd)
        unlock_dest(fd)  # already released: nothing (the fd number may be reused)
        assert lock_holder(path) == (False, None)


def test_no_lock_file_is_no_holder(tmp_path: Path) -> None:
    assert lock_holder(tmp_path / "absent") == (False, None)


def test_a_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    fd = lock_dest(tmp_path, path)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        os.close(reader)
        try:
            os.fstat(fd)
            kept = b"fd"  # the lock's fd still open in the child
        except OSError:
            kept = b"set" if lock._LOCK_FDS else b"-"
        os.write(writer, kept)
        time.sleep(60)  # alive while the parent looks (killed then)
        os._exit(0)
    os.close(writer)
    try:
        assert os.read(reader, 8) == b"-"  # closed, and forgotten
        unlock_dest(fd)
        assert lock_holder(path) == (False, None)  # the child, still alive, holds nothing
    finally:
        os.close(reader)
        os.kill(child, 9)
        os.waitpid(child, 0)
