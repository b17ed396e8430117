"""The tar sink on its own: shard format (read back by tarfile), rolling at page boundaries,
what a flush keeps and drops, and index.recover() after a killed run. Every test runs with
the C packer and with the Python one."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import tarfile
from collections import deque
from pathlib import Path

import pytest

from bulkfetch.dest import index
from bulkfetch.models import Failure, PageReport
from bulkfetch.sinks import tar, ustar
from bulkfetch.sinks.base import Spool
from bulkfetch.sinks.directory import TMP_DIR
from bulkfetch.sinks.tar import TarSink
from bulkfetch.sinks.ustar import pax_records


@pytest.fixture(autouse=True, params=["c", "python"])
def packer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c" and not ustar.ACCELERATED:
        pytest.fail(ustar.NOT_BUILT)
    accelerated = request.param == "c"
    monkeypatch.setattr(tar, "new_packer", lambda fd, where, mtime: ustar.new_packer(
        fd, where, mtime, accelerated=accelerated))
    return request.param


def make_sink(dest: Path, worker: int = 0, shard_files: int = 1000,
              shard_size: int = 1 << 30) -> TarSink:
    dest.mkdir(exist_ok=True)
    index.connect(dest, create=True).close()
    return TarSink(dest, worker, shard_files, shard_size)


def members(dest: Path) -> dict[str, tuple[str, int, int, str]]:
    with sqlite3.connect(dest / index.INDEX_NAME) as conn:
        return {name: (file, offset, size, md5) for name, file, offset, size, md5 in
                conn.execute("SELECT m.name, s.file, m.offset, m.size, m.md5 "
                             "FROM members m JOIN shards s ON s.id = m.shard")}


def read_shard(path: Path) -> list[tuple[str, bytes, int]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read(), m.offset_data) for m in tar]


def settled(sink: TarSink, released: list[PageReport]) -> list[PageReport]:
    """`released` plus what the shard closer releases once it has finished its work."""
    for future in list(sink.closing):
        future.result(timeout=30)
    return released + sink.ready()


def write_page(sink: TarSink, seq: int, files: dict[str, bytes]) -> list[PageReport]:
    write = sink.begin_page(seq)
    for name, body in files.items():
        write(name, body, None)
    return settled(sink, sink.end_page(PageReport(seq, len(files),
                                                  sum(map(len, files.values())))))


def test_members_read_back_by_tarfile_with_right_offsets_and_md5(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    sink = make_sink(dest)
    files = {
        "plain.txt": b"x" * 100,
        "a/b/c/nested.bin": bytes(range(256)) * 3,
        "n" * 100: b"exactly one hundred bytes of name",
        "l" * 99 + "/" + "m" * 150: b"long name needs a PAX header",
        "caf\u00e9/\u65e5\u672c.txt": b"non-ASCII needs PAX too",
        "empty": b"",
        "block": b"b" * 512,
    }
    assert write_page(sink, 0, files) == []  # held until the shard closes
    released = sink.flush()
    sink.close()
    assert [r.seq for r in released] == [0]
    shard = dest / "shard-000-000001.tar"
    assert sorted(os.listdir(dest)) == [index.INDEX_NAME, shard.name]
    read = read_shard(shard)
    assert [(name, data) for name, data, _ in read] == list(files.items())
    rows = members(dest)
    assert set(rows) == set(files)
    for name, data, offset in read:
        assert rows[name] == (shard.name, offset, len(data), hashlib.md5(data).hexdigest())
        with open(shard, "rb") as fh:
            fh.seek(offset)
            assert fh.read(len(data)) == data
    assert shard.stat().st_size % 512 == 0


def test_each_shard_packs_with_the_packer_under_test(tmp_path: Path, packer: str) -> None:
    sink = make_sink(tmp_path / "dest")
    sink.begin_page(0)
    assert sink.current is not None
    assert isinstance(sink.current.packer, ustar.PyPacker) is (packer == "python")
    sink.close()


def test_given_md5_is_recorded_as_is(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    sink = make_sink(dest)
    sink.begin_page(0)("f", b"body", "0" * 32)
    sink.end_page(PageReport(0, 1, 4))
    sink.flush()
    sink.close()
    assert members(dest)["f"][3] == "0" * 32


def test_pax_record_length_counts_itself() -> None:
    for value in ("x", "y" * 5, "z" * 93, "w" * 994):
        record = pax_records({"path": value})
        length, _, rest = record.partition(b" ")
        assert int(length) == len(record) and rest == f"path={value}\n".encode()


def test_pages_begun_before_any_file_arrives_fill_shards_by_the_files_they_bring(
        tmp_path: Path) -> None:
    # the start of a run: every page out begins before the first body comes back
    dest = tmp_path / "dest"
    sink = make_sink(dest, shard_files=3)
    writers = [sink.begin_page(seq, [f"p{seq}-0", f"p{seq}-1"]) for seq in range(4)]
    for seq, write in enumerate(writers):
        write(f"p{seq}-0", b"x", None)
        write(f"p{seq}-1", b"x", None)
    released = []
    for seq in range(4):
        released += sink.end_page(PageReport(seq, 2, 2))
    released = settled(sink, released) + sink.flush()
    assert sorted(r.seq for r in released) == [0, 1, 2, 3]
    # 2 + 2 files given reach 3: two pages a shard, not all four in the first
    assert [n for n, _, _ in read_shard(dest / "shard-000-000001.tar")] == [
        "p0-0", "p0-1", "p1-0", "p1-1"]
    assert [n for n, _, _ in read_shard(dest / "shard-000-000002.tar")] == [
        "p2-0", "p2-1", "p3-0", "p3-1"]
    sink.close()


def test_a_page_stays_in_one_shard_and_a_full_shard_closes_when_its_pages_end(
        tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    sink = make_sink(dest, shard_files=3)
    first = sink.begin_page(0)
    second = sink.begin_page(1)
    for i in range(3):
        first(f"p0-{i}", b"0", None)
    second("p1-0", b"1", None)
    # shard 1 is full: page 2 starts shard 2 while pages 0 and 1 still write into shard 1
    third = sink.begin_page(2)
    third("p2-0", b"2", None)
    second("p1-1", b"1", None)
    assert sink.end_page(PageReport(0, 3, 3)) == []
    assert sink.end_page(PageReport(2, 1, 1)) == []  # shard 2 is the current one
    released = settled(sink, sink.end_page(PageReport(1, 2, 2)))  # shard 1's last page
    assert [r.seq for r in released] == [0, 1]
    assert [n for n, _, _ in read_shard(dest / "shard-000-000001.tar")] == [
        "p0-0", "p0-1", "p0-2", "p1-0", "p1-1"]
    assert (dest / "shard-000-000002.tar.part").exists()
    assert [r.seq for r in sink.flush()] == [2]
    sink.close()
    assert [n for n, _, _ in read_shard(dest / "shard-000-000002.tar")] == ["p2-0"]
    assert len(members(dest)) == 6


def test_shard_size_rolls_too(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    sink = make_sink(dest, shard_files=10**6, shard_size=2048)
    for seq in range(3):
        write_page(sink, seq, {f"f{seq}": b"x" * 1500})
    sink.flush()
    sink.close()
    assert sorted(p.name for p in dest.glob("shard-*")) == [
        "shard-000-000001.tar", "shard-000-000002.tar", "shard-000-000003.tar"]


def test_page_without_stored_files_is_released_at_once(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    sink = make_sink(dest)
    sink.begin_page(7)
    report = PageReport(7, 0, 0, (Failure("bad", "HTTP 404", 1),))
    assert sink.end_page(report) == [report]
    assert sink.flush() == []
    sink.close()
    assert not list(dest.glob("shard-*"))


def test_flush_drops_a_shard_with_an_unfinished_page(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    sink = make_sink(dest)
    write_page(sink, 0, {"a": b"a"})
    sink.begin_page(1)("b", b"b", None)  # page 1 never ends (a stop)
    assert sink.flush() == []
    sink.close()
    assert not list(dest.glob("shard-*"))
    assert members(dest) == {}


def test_numbers_continue_after_existing_shards_of_the_same_worker(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    for name in ("shard-003-000004.tar", "shard-001-000009.tar"):
        (dest / name).parent.mkdir(exist_ok=True)
        (dest / name).write_bytes(b"")
    sink = make_sink(dest, worker=3)
    write_page(sink, 0, {"a": b"a"})
    sink.flush()
    sink.close()
    assert (dest / "shard-003-000005.tar").exists()


def test_recover_after_kills_between_each_step(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    conn = index.connect(dest, create=True)
    # fully done in a previous run
    (dest / "shard-000-000000.tar").write_bytes(b"old")
    index.add_shard(conn, "shard-000-000000.tar", 0, 3, 0.0, [PageReport(0, 1, 1)],
                    [("z", 512, 1, "0" * 32)])
    # closed and indexed, but killed before the rename
    (dest / "shard-000-000001.tar.part").write_bytes(b"indexed")
    index.add_shard(conn, "shard-000-000001.tar", 0, 7, 0.0, [PageReport(1, 1, 1)],
                    [("a", 512, 1, "0" * 32)])
    conn.close()
    (dest / "shard-001-000001.tar.part").write_bytes(b"never closed")
    (dest / "shard-001-000002.tar").write_bytes(b"renamed but not indexed")
    (dest / "notes.txt").write_text("not ours")
    journaled = {0}
    reports = index.recover(dest, journaled.__contains__)
    assert [r.seq for r in reports] == [1]
    assert sorted(os.listdir(dest)) == [
        index.INDEX_NAME, "notes.txt", "shard-000-000000.tar", "shard-000-000001.tar"]
    assert (dest / "shard-000-000001.tar").read_bytes() == b"indexed"


def test_recover_stops_at_each_workers_newest_journaled_shard(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    conn = index.connect(dest, create=True)
    for shard, (worker, seq) in enumerate([(0, 1), (1, 2), (0, 3), (1, 4), (0, 5)]):
        index.add_shard(conn, f"shard-00{worker}-00000{shard}.tar", worker, 0, 0.0,
                        [PageReport(seq, 1, 1)], [(f"n{seq}", 512, 1, "0" * 32)])
    conn.close()
    asked: list[int] = []

    def is_done(seq: int) -> bool:
        asked.append(seq)
        return seq in {1, 2, 3, 4}

    assert [r.seq for r in index.recover(dest, is_done)] == [5]
    assert asked == [5, 4, 3]  # worker 0: 5 (not done), 3 (done: stop); worker 1: 4 (stop)


def test_index_keeps_one_row_per_name(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    sink = make_sink(dest, shard_files=1)
    write_page(sink, 0, {"same": b"first"})
    write_page(sink, 1, {"same": b"second"})
    sink.flush()
    sink.close()
    rows = members(dest)
    assert list(rows) == ["same"]
    assert rows["same"][0] == "shard-000-000002.tar"


def test_disk_full_is_fatal(tmp_path: Path) -> None:
    from bulkfetch.sinks.base import SinkFatal

    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    dest = tmp_path / "dest"
    sink = make_sink(dest)
    write = sink.begin_page(0)
    shard = sink.current
    assert shard is not None
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, shard.fd)  # the packer writes to this descriptor number
    os.close(full)
    with pytest.raises(SinkFatal, match="No space left"):
        for i in range(3000):
            write(f"f{i}", b"x" * 1000, None)
    sink.close()


def test_a_full_shard_closes_as_soon_as_its_last_page_ends(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    sink = make_sink(dest, shard_files=2)
    assert write_page(sink, 0, {"a": b"a"}) == []
    released = write_page(sink, 1, {"b": b"b", "c": b"c"})  # full, and no page open
    assert [r.seq for r in released] == [0, 1]
    assert (dest / "shard-000-000001.tar").exists()
    assert [r.seq for r in write_page(sink, 2, {"d": b"d", "e": b"e"})] == [2]
    assert sink.flush() == []
    sink.close()
    assert sorted(p.name for p in dest.glob("shard-*")) == [
        "shard-000-000001.tar", "shard-000-000002.tar"]


def test_many_members_are_indexed_in_multi_row_batches(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    sink = make_sink(dest)
    files = {f"m{i:04d}": bytes([i % 256]) * (i % 700) for i in range(250)}
    write_page(sink, 0, files)
    sink.flush()
    sink.close()
    rows = members(dest)
    read = read_shard(dest / "shard-000-000001.tar")
    assert len(rows) == len(read) == 250
    for name, data, offset in read:
        assert files[name] == data
        assert rows[name] == ("shard-000-000001.tar", offset, len(data),
                              hashlib.md5(data).hexdigest())


def test_a_failure_while_closing_in_the_background_stops_the_run(tmp_path: Path) -> None:
    from bulkfetch.sinks.base import SinkFatal

    dest = tmp_path / "dest"
    sink = make_sink(dest)
    (dest / "shard-000-000001.tar").mkdir()  # the rename into place must fail
    sink.begin_page(0)("a", b"a", None)
    sink.end_page(PageReport(0, 1, 1))
    with pytest.raises(SinkFatal, match="cannot rename"):
        sink.flush()
    sink.close()


def test_cached_header_tails_give_every_member_its_own_name_and_checksum(
        tmp_path: Path) -> None:
    # Anagrams share length and byte sum, so their headers share the cached 412-byte tail;
    # tarfile checks each header's checksum and name.
    dest = tmp_path / "dest"
    sink = make_sink(dest)
    files = {}
    for size in (0, 1, 100, 511, 512, 513):
        for name in ("abc", "acb", "bca", "cab", "abcd", "dcba", "x" * 90):
            files[f"{name}-{size}"] = os.urandom(size)
    write_page(sink, 0, files)
    sink.flush()
    sink.close()
    read = read_shard(dest / "shard-000-000001.tar")
    assert [(name, data) for name, data, _ in read] == list(files.items())


def live_counts(dest: Path) -> dict[str, int]:
    with sqlite3.connect(dest / index.INDEX_NAME) as conn:
        return dict(conn.execute("SELECT file, live FROM shards"))


def test_superseded_shards_are_found_by_live_counts_without_scanning_members(
        tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    conn = index.connect(dest, create=True)
    md5 = "0" * 32
    index.add_shard(conn, "shard-000-000000.tar", 0, 9, 0.0, [],
                    [("a", 512, 1, md5), ("b", 1536, 1, md5), ("a", 2560, 1, md5)])
    index.add_shard(conn, "shard-000-000001.tar", 0, 9, 0.0, [],
                    [("b", 512, 1, md5), ("c", 1536, 1, md5)])
    assert live_counts(dest) == {"shard-000-000000.tar": 1, "shard-000-000001.tar": 2}
    index.add_shard(conn, "shard-000-000002.tar", 0, 9, 0.0, [], [("a", 512, 1, md5)])
    plan = " ".join(row[-1] for row in conn.execute(
        "EXPLAIN QUERY PLAN SELECT file FROM shards WHERE live <= 0"))
    conn.close()
    assert "members" not in plan
    for number in range(3):
        (dest / f"shard-000-00000{number}.tar").write_bytes(b"x")
    assert index.drop_superseded(dest) == ["shard-000-000000.tar"]
    assert sorted(p.name for p in dest.glob("shard-*")) == [
        "shard-000-000001.tar", "shard-000-000002.tar"]
    assert live_counts(dest) == {"shard-000-000001.tar": 2, "shard-000-000002.tar": 1}
    assert set(members(dest)) == {"a", "b", "c"}


def test_an_index_of_schema_1_gets_its_live_counts(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with sqlite3.connect(dest / index.INDEX_NAME) as old:  # as bulkfetch wrote it before
        old.executescript(f"""
            CREATE TABLE shards (id INTEGER PRIMARY KEY, file TEXT NOT NULL UNIQUE,
                worker INTEGER NOT NULL, files INTEGER NOT NULL, bytes INTEGER NOT NULL,
                size INTEGER NOT NULL, closed_at REAL NOT NULL, pages TEXT NOT NULL);
            CREATE TABLE members (name TEXT NOT NULL, shard INTEGER NOT NULL
                REFERENCES shards(id), offset INTEGER NOT NULL, size INTEGER NOT NULL,
                md5 TEXT NOT NULL);
            CREATE UNIQUE INDEX members_by_name ON members(name);
            INSERT INTO shards VALUES (1, 'shard-000-000000.tar', 0, 2, 2, 9, 0, '[]'),
                                      (2, 'shard-000-000001.tar', 0, 1, 1, 9, 0, '[]'),
                                      (3, 'shard-000-000009.tar', 0, 1, 1, 9, 0, '[]');
            INSERT INTO members VALUES ('a', 2, 512, 1, 'x'), ('b', 1, 1536, 1, 'x');
            PRAGMA application_id = {index.APPLICATION_ID}; PRAGMA user_version = 1;""")
    old.close()
    conn = index.connect(dest, create=True)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == index.SCHEMA_VERSION
    assert live_counts(dest) == {"shard-000-000000.tar": 1, "shard-000-000001.tar": 1,
                                 "shard-000-000009.tar": 0}  # all of it superseded before
    index.add_shard(conn, "shard-000-000002.tar", 0, 9, 0.0, [], [("b", 512, 1, "y")])
    conn.close()
    assert live_counts(dest)["shard-000-000000.tar"] == 0  # the trigger works after it
    assert sorted(index.drop_superseded(dest)) == ["shard-000-000000.tar",
                                                   "shard-000-000009.tar"]


def test_an_index_from_a_newer_bulkfetch_is_refused(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with sqlite3.connect(dest / index.INDEX_NAME) as newer:
        newer.execute(f"PRAGMA user_version = {index.SCHEMA_VERSION + 1}")
    newer.close()
    with pytest.raises(sqlite3.DatabaseError, match="newer than this bulkfetch"):
        index.connect(dest, create=True)


def test_reports_of_shards_closed_before_a_failure_travel_with_it(tmp_path: Path) -> None:
    """A shard that closed cleanly is indexed: its pages' reports must reach the journal even
    when a later shard's close fails, so ready() and flush() hand them over in the error."""
    from concurrent.futures import Future

    from bulkfetch.sinks.base import SinkFatal

    def closes(*outcomes: list[PageReport] | SinkFatal) -> list[Future[list[PageReport]]]:
        futures: list[Future[list[PageReport]]] = []
        for outcome in outcomes:
            future: Future[list[PageReport]] = Future()
            if isinstance(outcome, SinkFatal):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
            futures.append(future)
        return futures

    sink = make_sink(tmp_path / "dest")
    first, second = [PageReport(0, 1, 1), PageReport(1, 2, 2)], [PageReport(2, 1, 1)]
    sink.closing.extend(closes(first, second, SinkFatal("cannot rename shard 3")))
    with pytest.raises(SinkFatal, match="shard 3") as caught:
        sink.ready()
    assert [r.seq for r in caught.value.released] == [0, 1, 2]

    sink.closing.extend(closes(first, SinkFatal("cannot update index"), second))
    sink.begin_page(7)("a", b"a", None)  # a shard flush() closes itself, after the others
    sink.end_page(PageReport(7, 1, 1))
    with pytest.raises(SinkFatal, match="cannot update index") as caught:
        sink.flush()
    assert [r.seq for r in caught.value.released] == [0, 1, 2, 7]
    assert sink.closing == deque() and list(tmp_path.glob("dest/*.part")) == []
    sink.close()
    assert SinkFatal("plain").released == []


# -- bodies streamed to a spool -------------------------------------------------------------
BIG = bytes(range(256)) * 4099 + b"tail"  # not a multiple of the tar block


@pytest.fixture
def fixed_mtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """One mtime for every shard, so shards packed apart can be compared byte for byte."""
    monkeypatch.setattr(tar.time, "time", lambda: 1_700_000_000.0)


def spool_into(sink: TarSink, name: str, body: bytes) -> Spool:
    spooled = sink.open_spool(name)
    for at in range(0, len(body), 65536):
        spooled.write(body[at : at + 65536])
    return spooled


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
            sink.store_spool(0, name, spool_into(sink, name, body), len(body),
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
        tmp_path: Path, fixed_mtime: None) -> None:
    files = {"small-1": b"x" * 100, "big": BIG, "l" * 120 + "/caf\u00e9": BIG[:70000],
             "small-2": b"", "empty-big": b""}
    spooled = {"big", "l" * 120 + "/caf\u00e9", "empty-big"}
    from_spools = pack(tmp_path / "a", files, spooled)
    from_memory = pack(tmp_path / "b", files, set())
    assert from_spools == from_memory
    with tarfile.open(tmp_path / "a" / next(p.name for p in (tmp_path / "a").glob("*.tar"))) as t:
        assert {m.name: t.extractfile(m).read() for m in t} == files


def test_tar_a_discarded_spool_leaves_no_file(tmp_path: Path, fixed_mtime: None) -> None:
    sink = tar_dest(tmp_path / "d")
    sink.begin_page(0)
    spool_into(sink, "x", BIG).discard()
    assert os.listdir(tmp_path / "d" / TMP_DIR) == []
    sink.close()


def test_packer_advance_needs_a_flushed_buffer(tmp_path: Path, packer: str) -> None:
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        made = ustar.new_packer(fd, "out", 0, accelerated=packer == "c")
        made.append(b"abc")
        with pytest.raises(ValueError, match="flushed"):
            made.advance(10)
        made.flush()
        with pytest.raises(ValueError):
            made.advance(-1)
        made.advance(10)
        assert made.offset == 13
    finally:
        os.close(fd)


def test_a_worker_given_up_for_lost_is_fenced_out_of_the_index(tmp_path: Path) -> None:
    """Its shards indexed before count; one it closes after (woken from a freeze, cut off
    from the cluster) is refused and its .tar.part never becomes a shard. A new run's
    workers, numbered from 0 again, are not fenced."""
    dest = tmp_path
    conn = index.connect(dest, create=True)
    member = [("a", 512, 1, "0" * 32)]
    index.add_shard(conn, "shard-003-000000.tar", 3, 1024, 0.0, [PageReport(0, 1, 1)], member)
    (dest / "shard-003-000000.tar").write_bytes(b"\0" * 1024)
    assert [r.seq for r in index.recover(dest, lambda seq: False, worker=3)] == [0]
    (dest / "shard-003-000001.tar.part").write_bytes(b"\0" * 1024)  # it wakes and closes
    with pytest.raises(sqlite3.IntegrityError, match="fenced"):
        index.add_shard(conn, "shard-003-000001.tar", 3, 1024, 0.0, [PageReport(1, 1, 1)],
                        [("b", 512, 1, "0" * 32)])
    index.add_shard(conn, "shard-004-000000.tar", 4, 1024, 0.0, [PageReport(1, 1, 1)],
                    [("b", 512, 1, "0" * 32)])  # the others go on
    assert {name for (name,) in conn.execute("SELECT name FROM members")} == {"a", "b"}
    index.recover(dest, lambda seq: True)  # the next start: the unindexed part goes
    assert not (dest / "shard-003-000001.tar.part").exists()
    index.clear_fences(dest)
    index.add_shard(conn, "shard-003-000002.tar", 3, 1024, 0.0, [PageReport(2, 1, 1)],
                    [("c", 512, 1, "0" * 32)])
    conn.close()


def test_an_index_shared_across_hosts_keeps_a_rollback_journal(tmp_path: Path) -> None:
    """WAL's index is shared memory, which only one host's processes share: with Ray actors
    on several machines the index takes the filesystem's locks instead (and back)."""
    def mode() -> str:
        with contextlib.closing(index.connect(tmp_path)) as conn:
            return str(conn.execute("PRAGMA journal_mode").fetchone()[0])

    index.connect(tmp_path, create=True).close()
    assert mode() == "wal"
    index.connect(tmp_path, create=True, across_hosts=True).close()
    assert mode() == "delete"
    assert not (tmp_path / (index.INDEX_NAME + "-wal")).exists()
    index.connect(tmp_path, create=True).close()
    assert mode() == "wal"
