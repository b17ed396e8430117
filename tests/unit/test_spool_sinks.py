"""Spooled bodies in each sink: a big body streamed to a spool appears only once stored, as
the same bytes a body in memory would give; failures leave no temporary file behind."""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkfetch import index
from bulkfetch.models import PageReport
from bulkfetch.sinks import tar, ustar
from bulkfetch.sinks.base import SinkFailure, Spool
from bulkfetch.sinks.directory import TMP_DIR, DirectorySink
from bulkfetch.sinks.null import NullSink
from bulkfetch.sinks.tar import TarSink

BIG = bytes(range(256)) * 4099 + b"tail"  # not a multiple of the tar block


def spool(sink: DirectorySink | TarSink | NullSink, name: str, body: bytes) -> Spool:
    spooled = sink.open_spool(name)
    for at in range(0, len(body), 65536):
        spooled.write(body[at : at + 65536])
    return spooled


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[DirectorySink]:
    dest = tmp_path / "dest"
    (dest / TMP_DIR).mkdir(parents=True)
    made = DirectorySink(dest, 0)
    yield made
    made.close()
    assert os.listdir(dest / TMP_DIR) == []


def test_dir_a_spooled_file_appears_only_when_stored(directory: DirectorySink) -> None:
    spooled = spool(directory, "a/b/big.bin", BIG)
    assert not (directory.dest / "a").exists()
    directory.store_spool(0, "a/b/big.bin", spooled, len(BIG), hashlib.md5(BIG).hexdigest())
    assert (directory.dest / "a/b/big.bin").read_bytes() == BIG
    assert oct((directory.dest / "a/b/big.bin").stat().st_mode & 0o777) == "0o644"


def test_dir_a_spool_replaces_an_old_file_and_a_discarded_one_leaves_nothing(
        directory: DirectorySink) -> None:
    (directory.dest / "f").write_bytes(b"old")
    spool(directory, "f", b"half of it").discard()
    assert (directory.dest / "f").read_bytes() == b"old"
    spooled = spool(directory, "f", BIG)
    directory.store_spool(0, "f", spooled, len(BIG), "")
    assert (directory.dest / "f").read_bytes() == BIG


def test_dir_a_directory_in_the_way_fails_the_file_and_removes_the_spool(
        directory: DirectorySink) -> None:
    (directory.dest / "taken" / "inside").mkdir(parents=True)
    spooled = spool(directory, "taken", BIG)
    with pytest.raises(SinkFailure, match="a directory is in the way of taken"):
        directory.store_spool(0, "taken", spooled, len(BIG), "")
    spooled = spool(directory, "taken/inside/x", BIG)
    (directory.dest / "file").write_bytes(b"")
    spooled2 = spool(directory, "file/x", BIG)
    with pytest.raises(SinkFailure, match="not a directory"):
        directory.store_spool(0, "file/x", spooled2, len(BIG), "")
    directory.store_spool(0, "taken/inside/x", spooled, len(BIG), "")
    assert (directory.dest / "taken/inside/x").read_bytes() == BIG


def test_null_keeps_nothing(tmp_path: Path) -> None:
    sink = NullSink()
    spooled = spool(sink, "x", BIG)
    sink.store_spool(0, "x", spooled, len(BIG), "")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(params=["c", "python"])
def accelerated(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "c" and not ustar.ACCELERATED:
        pytest.fail(ustar.NOT_BUILT)
    chosen = request.param == "c"
    monkeypatch.setattr(tar, "new_packer", lambda fd, where, mtime: ustar.new_packer(
        fd, where, mtime, accelerated=chosen))
    monkeypatch.setattr(tar.time, "time", lambda: 1_700_000_000.0)  # one mtime for both
    return chosen


def tar_dest(path: Path) -> TarSink:
    (path / TMP_DIR).mkdir(parents=True)
    index.connect(path, create=True).close()
    return TarSink(path, 0, 1000, 1 << 30)


def pack(dest: Path, files: dict[str, bytes], spooled: set[str]) -> bytes:
    """One page of `files` into a new tar sink, the names in `spooled` through a spool;
    the closed shard's bytes."""
    sink = tar_dest(dest)
    write = sink.begin_page(0)
    for name, body in files.items():
        if name in spooled:
            sink.store_spool(0, name, spool(sink, name, body), len(body),
                             hashlib.md5(body).hexdigest())
        else:
            write(name, body, None)
    sink.end_page(PageReport(0, len(files), sum(map(len, files.values()))))
    sink.flush()
    sink.close()
    assert os.listdir(dest / TMP_DIR) == []
    (shard,) = dest.glob("*.tar")
    return shard.read_bytes()


def test_tar_a_spooled_member_is_the_same_bytes_as_one_from_memory(
        tmp_path: Path, accelerated: bool) -> None:
    files = {"small-1": b"x" * 100, "big": BIG, "l" * 120 + "/caf\u00e9": BIG[:70000],
             "small-2": b"", "empty-big": b""}
    spooled = {"big", "l" * 120 + "/caf\u00e9", "empty-big"}
    from_spools = pack(tmp_path / "a", files, spooled)
    from_memory = pack(tmp_path / "b", files, set())
    assert from_spools == from_memory
    with tarfile.open(tmp_path / "a" / next(p.name for p in (tmp_path / "a").glob("*.tar"))) as t:
        assert {m.name: t.extractfile(m).read() for m in t} == files


def test_tar_a_discarded_spool_leaves_no_file(tmp_path: Path, accelerated: bool) -> None:
    sink = tar_dest(tmp_path / "d")
    sink.begin_page(0)
    spool(sink, "x", BIG).discard()
    assert os.listdir(tmp_path / "d" / TMP_DIR) == []
    sink.close()


def test_packer_advance_needs_a_flushed_buffer(tmp_path: Path, accelerated: bool) -> None:
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        packer = ustar.new_packer(fd, "out", 0, accelerated=accelerated)
        packer.append(b"abc")
        with pytest.raises(ValueError, match="flushed"):
            packer.advance(10)
        packer.flush()
        with pytest.raises(ValueError):
            packer.advance(-1)
        packer.advance(10)
        assert packer.offset == 13
    finally:
        os.close(fd)
