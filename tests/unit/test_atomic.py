"""util/atomic.py: a file written whole or not at all. The bytes and mode land, nothing
temporary is left on success or failure, the data is flushed and fsynced before the rename
and the directory after it, and no descriptor leaks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bulkfetch.util import atomic
from bulkfetch.util.atomic import fsync_directory, write_atomically, write_durably


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_write_durably_lands_the_bytes_and_the_mode_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / ("n" * 200)  # a long name still has room for the temporary's
    target.write_bytes(b"old")
    write_durably(target, b"new bytes")
    assert target.read_bytes() == b"new bytes"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's 0600
    write_durably(target, b"private", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == [target.name]


def test_write_durably_fsyncs_the_whole_file_then_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[str, int]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        synced.append(("dir" if stat.S_ISDIR(info.st_mode) else "file", info.st_size))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    before = open_fds()
    write_durably(tmp_path / "f", b"x" * 100)  # less than a buffer: only a flush writes it
    # the file's bytes all written (flushed) when it is fsynced; the rename made durable
    assert synced[0] == ("file", 100)
    assert synced[-1][0] == "dir" and len(synced) == 2
    assert open_fds() == before


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def refuse(*_: object) -> None:
        raise PermissionError(13, "refused")

    monkeypatch.setattr(atomic.os, "replace", refuse)
    with pytest.raises(PermissionError):
        write_durably(target, b"new")
    with pytest.raises(PermissionError):
        write_atomically(target, "new")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_no_directory_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_durably(tmp_path / "absent" / "f", b"x")
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "absent" / "f", "x")
    assert os.listdir(tmp_path) == []


def test_write_atomically_replaces_the_text_whole(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    write_atomically(target, "first")
    write_atomically(target, "second, ü")
    assert target.read_text(encoding="utf-8") == "second, ü"
    assert os.listdir(tmp_path) == ["status.json"]


def test_fsync_directory_syncs_it_and_closes_what_it_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(atomic.os, "fsync", synced.append)
    before = open_fds()
    fsync_directory(tmp_path)
    assert len(synced) == 1 and open_fds() == before
    fsync_directory(tmp_path / "absent")  # best effort: nothing to open, nothing raised
    assert len(synced) == 1 and open_fds() == before


def test_an_fsync_the_platform_refuses_is_not_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fd: int) -> None:
        raise OSError(22, "not supported")

    monkeypatch.setattr(atomic.os, "fsync", refuse)
    before = open_fds()
    fsync_directory(tmp_path)
    assert open_fds() == before
