"""The benchmarks' new filesystem per file-writing row (`bulkfetch.bench.scratch`): a real
mkfs.ext4 and loop mount where this machine allows it, and the plain-directory fallback."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bulkfetch.bench import scratch
from bulkfetch.bench.scratch import FreshFilesystems


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mounts") as mounts:
        return [line.split()[1] for line in mounts if line.split()[1].startswith(str(path))]


def test_each_row_gets_a_new_filesystem_that_is_gone_afterwards(tmp_path: Path) -> None:
    filesystems = FreshFilesystems(tmp_path)
    if not filesystems.available:
        pytest.skip(f"no new filesystem here: {filesystems.reason}")
    where = tmp_path / "fs-row"
    for round_ in range(2):
        with filesystems.row(where, files=5000):
            assert os.path.ismount(where)
            assert os.stat(where).st_dev != os.stat(tmp_path).st_dev
            dest = where / "dest"
            dest.mkdir()
            assert not any(p.name.startswith("f") for p in where.iterdir() if p != dest), \
                f"round {round_}: files of the last row are still there"
            for i in range(5000):  # as many inodes as asked for
                (dest / f"f{i}").write_bytes(b"x" * 100)
            assert len(os.listdir(dest)) == 5000
        assert mounts_under(tmp_path) == []
        assert not where.exists() and not where.with_name("fs-row.img").exists()
    assert "new ext4" in filesystems.note


def test_without_root_rows_run_in_a_plain_directory_removed_afterwards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(scratch, "settle", lambda path: shutil.rmtree(path))  # no 2 s pause
    filesystems = FreshFilesystems(tmp_path)
    assert not filesystems.available and "root" in (filesystems.reason or "")
    assert "earlier rows' deletes" in filesystems.note
    where = tmp_path / "fs-row"
    with filesystems.row(where, files=10):
        assert where.is_dir() and not os.path.ismount(where)
        (where / "dest").mkdir()
        (where / "dest" / "f").write_bytes(b"x")
    assert not where.exists()
    assert mounts_under(tmp_path) == []
