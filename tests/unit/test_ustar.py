"""The two packers (C and Python) write the same bytes and index fields for the same
members, tarfile reads them back, and both fail the same way on a full disk."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

import pytest

from bulkfetch.sinks import ustar
from bulkfetch.sinks.base import SinkFatal

MTIME = 1_700_000_000


def members_to_pack() -> list[tuple[str, bytes, str | None]]:
    out: list[tuple[str, bytes, str | None]] = []
    for size in (0, 1, 100, 511, 512, 513, 5000):
        body = os.urandom(size)
        for name in ("a", "abc", "cab", "dir/sub/file.bin", "n" * 99, "m" * 100):
            out.append((f"{name}-{size}"[-100:], body, None))
        out.append(("long-" + "x" * 120, body, None))  # over 100 bytes: PAX
        out.append(("ünïcode-ñame.txt", body, None))  # not ASCII: PAX
        out.append((f"given-{size}", body, "f" * 32))  # a verified digest kept as is
    out.append(("big", os.urandom(ustar.FLUSH_AT + 12345), None))  # bypasses the buffer
    out.append(("after-big", b"tail", None))
    return out


def pack(path: Path, accelerated: bool, items: list[tuple[str, bytes, str | None]]
         ) -> tuple[bytes, list[str | int], int]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        packer = ustar.new_packer(fd, str(path), MTIME, accelerated=accelerated)
        assert isinstance(packer, ustar.PyPacker) is not accelerated
        for name, body, md5 in items:
            packer.add(name, body, md5)
        packer.append(ustar.END)
        packer.flush()
        members, offset = list(packer.members), packer.offset
        packer.release()
        assert packer.members == []
    finally:
        os.close(fd)
    return path.read_bytes(), members, offset


@pytest.fixture(scope="module", autouse=True)
def needs_c_packer() -> None:
    if not ustar.ACCELERATED:
        pytest.fail(ustar.NOT_BUILT)


def test_both_packers_write_the_same_archive_that_tarfile_reads(tmp_path: Path) -> None:
    items = members_to_pack()
    c_bytes, c_members, c_offset = pack(tmp_path / "c.tar", True, items)
    py_bytes, py_members, py_offset = pack(tmp_path / "py.tar", False, items)
    assert c_bytes == py_bytes
    assert c_members == py_members
    assert c_offset == py_offset == len(c_bytes)
    assert len(c_bytes) % ustar.BLOCK == 0

    with tarfile.open(tmp_path / "c.tar") as archive:
        read = [(m.name, archive.extractfile(m).read(), m.offset_data, m.mtime)
                for m in archive]
    assert [(name, data) for name, data, _, _ in read] == [(n, b) for n, b, _ in items]
    assert {mtime for *_, mtime in read} == {MTIME}
    rows = [tuple(c_members[at:at + 4]) for at in range(0, len(c_members), 4)]
    for (name, body, md5), (row_name, data_at, size, digest), (_, _, offset, _) in zip(
            items, rows, read, strict=True):
        assert (row_name, data_at, size) == (name, offset, len(body))
        assert digest == (md5 or hashlib.md5(body).hexdigest())


@pytest.mark.parametrize("accelerated", [True, False], ids=["c", "python"])
def test_a_full_disk_raises_sink_fatal_naming_the_file(accelerated: bool) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        packer = ustar.new_packer(fd, "DEST/shard-000-000001.tar.part", MTIME,
                                  accelerated=accelerated)
        with pytest.raises(SinkFatal, match=r"^cannot write DEST/shard-000-000001\.tar\.part: "
                                            r"No space left on device$"):
            for number in range(3000):
                packer.add(f"f{number}", b"x" * 1000, None)
    finally:
        os.close(fd)


def test_the_c_packer_refuses_bad_arguments(tmp_path: Path) -> None:
    from bulkfetch.sinks._ustar import Packer

    fd = os.open(tmp_path / "x.tar", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        packer = ustar.new_packer(fd, "x.tar", MTIME)
        with pytest.raises(TypeError, match="name must be str"):
            packer.add(b"bytes-name", b"body", None)
        with pytest.raises(TypeError):
            packer.add("name", "not bytes", None)
        with pytest.raises(TypeError, match="3 arguments"):
            packer.add("name", b"body")
        assert packer.members == [] and packer.offset == 0
        with pytest.raises(ValueError, match="512 bytes"):
            Packer(fd, "x.tar", b"short", MTIME, ustar.FLUSH_AT, SinkFatal, len, len)
        with pytest.raises(ValueError, match="not initialised"):
            Packer.__new__(Packer).add("name", b"body", None)
    finally:
        os.close(fd)
