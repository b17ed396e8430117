"""open_dataset(): reading tar and directory destinations back (bulkfetch.dataset).

Tar destinations are built here with Python's tarfile (PAX format: ustar headers, 'x'
headers for long and non-ASCII names) and indexed with bulkfetch.dest.index, offsets taken from
tarfile's own TarInfo.offset_data; directory destinations are plain files. Every check is on
bytes, counts or checksums computed here, not on what the module says about itself.
"""

from __future__ import annotations

import gc
import hashlib
import os
import tarfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from bulkfetch.dataset import (
    DirectoryDataset,
    MemberInfo,
    TarDataset,
    open_dataset,
)
from bulkfetch.dest import index
from bulkfetch.dest.journal import Journal
from bulkfetch.errors import BulkfetchError, DataCorrupt, DataUnreadable, UsageError
from bulkfetch.sinks.directory import DirectorySink
from bulkfetch.testing import write_dir_destination as build_dir_dest
from bulkfetch.testing import write_tar_destination as build_tar_dest
from bulkfetch.util.names import local_parts


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def peak(run: Callable[[], object]) -> int:
    """Peak bytes Python allocated while `run` ran."""
    gc.collect()
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


LONG_NAME = "deep/" + "n" * 180 + ".bin"  # > 100 characters: needs a PAX header
SHARD_1 = [("zeta.txt", b"last letter"), ("photos/cat.jpg", b"\xff\xd8 cat" * 100),
           ("été/café.txt", "crème brûlée".encode())]
SHARD_2 = [("alpha", b"first"), (LONG_NAME, os.urandom(5000)), ("empty", b"")]
ALL = dict(SHARD_1 + SHARD_2)


@pytest.fixture
def tar_dest(tmp_path: Path) -> Path:
    dest = tmp_path / "tar-dest"
    build_tar_dest(dest, [SHARD_1, SHARD_2])
    return dest


@pytest.fixture
def dir_dest(tmp_path: Path) -> Path:
    dest = tmp_path / "dir-dest"
    build_dir_dest(dest, ALL)
    (dest / ".bulkfetch").mkdir()
    (dest / ".bulkfetch" / "journal.sqlite").write_bytes(b"state, not data")
    return dest


# -- tar --------------------------------------------------------------------------------------


def test_tar_iterates_in_index_order_with_exact_bytes(tar_dest: Path) -> None:
    with open_dataset(tar_dest) as ds:
        assert isinstance(ds, TarDataset) and ds.kind == "tar"
        assert list(ds) == SHARD_1 + SHARD_2  # shard order, not sorted order
        assert len(ds) == 6


def test_tar_reads_each_shard_once_and_sequentially(tar_dest: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    reads: list[int] = []
    real_open, real_pread = os.open, os.pread

    def counting_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).startswith("shard-"):
            opened.append(str(path))
        return real_open(path, *args, **kwargs)

    def counting_pread(fd: int, size: int, offset: int) -> bytes:
        reads.append(offset)
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "pread", counting_pread)
    with open_dataset(tar_dest) as ds:
        assert sum(1 for _ in ds) == 6
    assert opened == ["shard-000-000001.tar", "shard-000-000002.tar"]
    # within a shard the offsets only grow: front-to-back reading
    assert reads[:3] == sorted(reads[:3]) and reads[3:] == sorted(reads[3:])


def test_tar_get_is_one_lookup_and_one_pread(tar_dest: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    conn = index.connect(tar_dest)
    offset, size = conn.execute("SELECT offset, size FROM members WHERE name = ?",
                                (LONG_NAME,)).fetchone()
    conn.close()
    calls: list[tuple[int, int]] = []
    real_pread = os.pread

    def recording_pread(fd: int, n: int, at: int) -> bytes:
        calls.append((n, at))
        return real_pread(fd, n, at)

    with open_dataset(tar_dest) as ds:
        monkeypatch.setattr(os, "pread", recording_pread)
        body = ds.get(LONG_NAME)
    assert body == ALL[LONG_NAME]
    assert calls == [(size, offset)]


def test_tar_get_contains_getitem_and_missing(tar_dest: Path) -> None:
    with open_dataset(tar_dest) as ds:
        for name, body in ALL.items():
            assert name in ds
            assert ds.get(name) == body
            assert ds[name] == body
        assert "nope" not in ds
        assert 42 not in ds
        assert "\udcff" not in ds  # a lone surrogate cannot even be bound to the query
        with pytest.raises(KeyError):
            ds.get("nope")
        with pytest.raises(KeyError):
            ds["photos/cat.jpg/"]
        with pytest.raises(KeyError):
            ds.info("nope")


def test_tar_info_matches_the_tar_file(tar_dest: Path) -> None:
    with tarfile.open(tar_dest / "shard-000-000001.tar") as tar:
        member = tar.getmember("été/café.txt")
    with open_dataset(tar_dest) as ds:
        info = ds.info("été/café.txt")
    assert info == MemberInfo("été/café.txt", member.size, md5(ALL["été/café.txt"]),
                              "shard-000-000001.tar", member.offset_data)
    with pytest.raises(AttributeError):
        info.size = 0  # type: ignore[misc]  # frozen


def test_names_with_glob_patterns(tar_dest: Path) -> None:
    with open_dataset(tar_dest) as ds:
        assert list(ds.names()) == [n for n, _ in SHARD_1 + SHARD_2]
        assert list(ds.names("*.txt")) == ["zeta.txt", "été/café.txt"]  # '*' crosses '/'
        assert list(ds.names("photos/*")) == ["photos/cat.jpg"]
        assert list(ds.names("?????")) == ["alpha", "empty"]
        assert list(ds.names("[!a-z]*")) == ["été/café.txt"]  # é is not in a-z
        assert list(ds.names("ZETA.TXT")) == []  # case-sensitive
        assert [n for n, _ in ds.items("*.txt")] == ["zeta.txt", "été/café.txt"]
        assert [i.name for i in ds.infos("deep/*")] == [LONG_NAME]


def test_tar_md5_mismatch_after_corrupting_one_byte(tar_dest: Path) -> None:
    with open_dataset(tar_dest) as ds:
        info = ds.info("photos/cat.jpg")
    assert info.shard is not None and info.offset is not None
    with open(tar_dest / info.shard, "r+b") as shard:
        shard.seek(info.offset + 7)
        byte = shard.read(1)
        shard.seek(info.offset + 7)
        shard.write(bytes([byte[0] ^ 0x01]))

    with open_dataset(tar_dest) as ds:
        with pytest.raises(DataCorrupt) as caught:
            ds.get("photos/cat.jpg")
        assert "MD5 mismatch" in str(caught.value)
        assert caught.value.name == "photos/cat.jpg"
        assert isinstance(caught.value, BulkfetchError)
        assert ds.get("zeta.txt") == ALL["zeta.txt"]  # the neighbours are fine

        with pytest.raises(DataCorrupt):
            list(ds)  # plain iteration does not hand out damaged bytes

        errors: list[tuple[str, DataUnreadable]] = []
        good = list(ds.items(on_error=lambda name, exc: errors.append((name, exc))))
        assert [name for name, _ in errors] == ["photos/cat.jpg"]
        assert good == [(n, b) for n, b in SHARD_1 + SHARD_2 if n != "photos/cat.jpg"]


def test_tar_truncated_and_missing_shards(tar_dest: Path) -> None:
    second = tar_dest / "shard-000-000002.tar"
    with open_dataset(tar_dest) as ds:
        end = ds.info(LONG_NAME).offset + len(ALL[LONG_NAME])  # type: ignore[operator]
    os.truncate(second, end - 10)
    with open_dataset(tar_dest) as ds:
        assert ds.get("alpha") == b"first"
        with pytest.raises(DataCorrupt, match="truncated"):
            ds.get(LONG_NAME)
    second.unlink()
    with open_dataset(tar_dest) as ds:
        with pytest.raises(DataCorrupt, match="missing"):
            ds.get("alpha")
        assert ds.get("zeta.txt") == ALL["zeta.txt"]
        errors: list[str] = []
        assert [n for n, _ in ds.items(on_error=lambda n, e: errors.append(n))] == [
            n for n, _ in SHARD_1]
        assert errors == [n for n, _ in SHARD_2]


def test_tar_index_cannot_point_outside_dest(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    build_tar_dest(dest, [[("secret", b"top secret")]])
    outside = tmp_path / "outside.tar"
    (dest / "shard-000-000001.tar").rename(outside)
    conn = index.connect(dest)
    conn.execute("UPDATE shards SET file = '../outside.tar'")
    conn.close()
    with open_dataset(dest) as ds, pytest.raises(DataCorrupt, match="no valid shard file"):
        ds.get("secret")
    # nor through a symlink in the shard's place
    conn = index.connect(dest)
    conn.execute("UPDATE shards SET file = 'shard-000-000001.tar'")
    conn.close()
    (dest / "shard-000-000001.tar").symlink_to(outside)
    with open_dataset(dest) as ds, pytest.raises(DataCorrupt, match="cannot be opened"):
        ds.get("secret")


def test_tar_invalid_index_rows_are_corrupt_not_crashes(tar_dest: Path) -> None:
    conn = index.connect(tar_dest)
    conn.execute("UPDATE members SET size = 1 << 62 WHERE name = 'alpha'")
    conn.execute("UPDATE members SET offset = -5 WHERE name = 'empty'")
    conn.execute("UPDATE members SET md5 = 'not-a-hash' WHERE name = 'zeta.txt'")
    conn.close()
    with open_dataset(tar_dest) as ds:
        with pytest.raises(DataCorrupt, match="truncated"):
            ds.get("alpha")  # no attempt to allocate 4 EiB
        for name in ("empty", "zeta.txt"):
            with pytest.raises(DataCorrupt, match="index row is invalid"):
                ds.get(name)


def test_tar_duplicate_name_keeps_the_later_copy(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    build_tar_dest(dest, [[("dup", b"old copy"), ("a", b"A")], [("b", b"B"), ("dup", b"new!")]])
    with open_dataset(dest) as ds:
        assert len(ds) == 3
        assert ds.get("dup") == b"new!"
        assert ds.info("dup").shard == "shard-000-000002.tar"
        assert list(ds) == [("a", b"A"), ("b", b"B"), ("dup", b"new!")]


def test_tar_during_a_run_reads_a_shard_not_yet_renamed(tar_dest: Path) -> None:
    # rows are committed just before the rename from .tar.part to .tar
    second = tar_dest / "shard-000-000002.tar"
    second.rename(second.with_name(second.name + ".part"))
    with open_dataset(tar_dest) as ds:
        assert ds.get("alpha") == b"first"


def test_tar_memory_does_not_grow_with_the_number_of_members(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    body = b"x" * 32
    build_tar_dest(dest, [[("seed", body)]])
    conn = index.connect(dest)
    offset = conn.execute("SELECT offset FROM members").fetchone()[0]
    conn.execute("BEGIN")
    conn.executemany(  # many names over the same bytes: the index is all that grows
        "INSERT INTO members (name, shard, offset, size, md5) VALUES (?, 1, ?, ?, ?)",
        ((f"dir-{i % 97:02d}/file-{i:09d}.dat", offset, len(body), md5(body))
         for i in range(30_000)))
    conn.execute("COMMIT")
    conn.close()

    with open_dataset(dest) as ds:
        streamed = peak(lambda: sum(len(b) for _, b in ds))
        held = peak(lambda: list(ds.names()))
        assert sum(1 for _ in ds.names("dir-05/*")) == len(range(5, 30_000, 97))
    assert held > 2_000_000  # the names themselves, for scale
    assert streamed < held / 20


def test_open_dataset_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        open_dataset(tmp_path / "nowhere")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(UsageError, match="is not a directory"):
        open_dataset(tmp_path / "file")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "index.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UsageError, match=r"index\.sqlite"):
        open_dataset(bad)
    other = tmp_path / "other"
    other.mkdir()
    index.connect(other, create=True).execute("PRAGMA application_id = 7")
    with pytest.raises(UsageError, match="not a bulkfetch shard index"):
        open_dataset(other)
    (tmp_path / "dir-index" / "index.sqlite").mkdir(parents=True)
    with pytest.raises(UsageError, match="not a readable file"):
        open_dataset(tmp_path / "dir-index")
    running = tmp_path / "running"  # a tar run that has not closed a shard yet
    Journal.open(running, {"source": "test", "sink": {"kind": "tar", "fanout": 0}}).close()
    (running / "shard-000-000001.tar.part").write_bytes(b"half a shard")
    with pytest.raises(UsageError, match=r"no index\.sqlite yet"):
        open_dataset(running)


# -- directory --------------------------------------------------------------------------------


def test_dir_sorted_walk_order_and_bytes(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    files = {"b": b"B", "a/z": b"AZ", "a.txt": b"A.TXT", "a/b/c": b"ABC", "A": b"upper"}
    build_dir_dest(dest, files)
    with open_dataset(dest) as ds:
        assert isinstance(ds, DirectoryDataset) and ds.kind == "dir"
        # depth-first, each directory sorted: 'a/...' before 'a.txt' although '.' < '/'
        assert list(ds.names()) == ["A", "a/b/c", "a/z", "a.txt", "b"]
        assert list(ds) == [(n, files[n]) for n in ["A", "a/b/c", "a/z", "a.txt", "b"]]
        assert len(ds) == 5


def test_dir_get_contains_info_and_state_dir(dir_dest: Path) -> None:
    with open_dataset(dir_dest) as ds:
        assert sorted(ds.names()) == sorted(ALL)
        assert len(ds) == len(ALL)
        for name, body in ALL.items():
            assert name in ds
            assert ds[name] == body
            assert ds.info(name) == MemberInfo(name, len(body), md5(body), None, None)
        assert ".bulkfetch/journal.sqlite" not in ds
        with pytest.raises(KeyError):
            ds.get(".bulkfetch/journal.sqlite")
        assert "photos" not in ds  # a directory is not a member
        with pytest.raises(KeyError):
            ds.get("photos")
        assert [i.md5 for i in ds.infos("*.txt")] == [
            md5(ALL[n]) for n in sorted(n for n in ALL if n.endswith(".txt"))]


def test_dir_planted_symlinks_are_neither_listed_nor_followed(dir_dest: Path,
                                                              tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"secret")
    (dir_dest / "leak.txt").symlink_to(outside / "secret.txt")
    (dir_dest / "linked").symlink_to(outside, target_is_directory=True)
    (dir_dest / "photos" / "up").symlink_to("..", target_is_directory=True)  # a loop
    os.mkfifo(dir_dest / "fifo")  # opening it for reading would block

    with open_dataset(dir_dest) as ds:
        assert sorted(ds.names()) == sorted(ALL)
        assert sorted(n for n, _ in ds) == sorted(ALL)
        for name in ("leak.txt", "linked/secret.txt", "photos/up/zeta.txt", "fifo"):
            assert name not in ds
            with pytest.raises(KeyError):
                ds.get(name)
    # a real directory swapped for a symlink: the path is not resolved through it
    (dir_dest / "photos").rename(tmp_path / "photos-moved")
    (dir_dest / "photos").symlink_to(tmp_path / "photos-moved", target_is_directory=True)
    with open_dataset(dir_dest) as ds:
        assert "photos/cat.jpg" not in ds
        assert "photos/cat.jpg" not in list(ds.names())


def test_dir_names_check_name_refuses_are_not_members(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    build_dir_dest(dest, {"ok": b"1", "trailing.": b"2", "space ": b"3", "ctl\x01": b"4"})
    with open_dataset(dest) as ds:
        assert list(ds.names()) == ["ok"]
        for name in ("trailing.", "space ", "ctl\x01", "../dest/ok", "/ok", "ok/."):
            assert name not in ds
            with pytest.raises(KeyError):
                ds.get(name)


def test_dir_fanout_names_are_mapped_back(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / ".bulkfetch" / "tmp").mkdir(parents=True)
    files = {"a/one": b"1", "two": b"22", "x/y/three": b"333"}
    sink = DirectorySink(dest, 0, fanout=2)
    for name, body in files.items():
        sink.write(name, body)
    sink.close()
    stray = dest / "zz"
    stray.mkdir()
    (stray / "stray").write_bytes(b"not where the sink would put it")
    (dest / "toplevel").write_bytes(b"not under the hash levels")

    with open_dataset(dest, fanout=2) as ds:
        assert sorted(ds.names()) == sorted(files)
        assert dict(ds) == files
        assert ds.get("x/y/three") == b"333"
        assert "zz/stray" not in ds
    with open_dataset(dest) as ds:  # no journal: no fanout, the hash levels show
        assert "/".join(local_parts("two", 2)) in list(ds.names())

    journal = Journal.open(dest, {"source": "test", "sink": {"kind": "dir", "fanout": 2}})
    journal.close()
    with open_dataset(dest) as ds:  # the journal says how the names are laid out
        assert dict(ds) == files


def test_dir_memory_does_not_grow_with_the_number_of_files(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    for d in range(100):
        folder = dest / f"d{d:03d}"
        folder.mkdir(parents=True)
        for f in range(30):
            (folder / f"file-{f:06d}-{'p' * 40}").write_bytes(b"")

    with open_dataset(dest) as ds:
        streamed = peak(lambda: sum(1 for _ in ds))
        held = peak(lambda: list(ds.names()))
        assert len(ds) == 3000
    assert streamed < held / 4


def test_closed_dataset_and_context_manager(tar_dest: Path, dir_dest: Path) -> None:
    for dest in (tar_dest, dir_dest):
        ds = open_dataset(dest)
        with ds as same:
            assert same is ds
        ds.close()  # twice is fine
