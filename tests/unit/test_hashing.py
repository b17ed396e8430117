"""`bulkfetch hash`'s pieces: checksum lines written and read as coreutils does, the walk,
batching, the ordered worker pool (out-of-order answers, a bounded window, a dead worker),
and the three runs on small real files in tmp_path."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import signal
import time
from pathlib import Path

import pytest

from bulkfetch.dataset import open_dataset
from bulkfetch.errors import BulkfetchError, UsageError
from bulkfetch.hashing import files as hashing
from bulkfetch.hashing.files import (
    HashOptions,
    HashProgress,
    WorkerPool,
    batched,
    check_entries,
    hash_paths,
    verify_members,
    walk,
)
from bulkfetch.testing import write_tar_destination
from bulkfetch.util.checksum_lines import (
    CheckEntry,
    ChecksumReader,
    check_line,
    check_warnings,
    parse_line,
    sum_line,
    sum_lines,
)

MD5_A = hashlib.md5(b"a").hexdigest()
SHA1_A = hashlib.sha1(b"a").hexdigest()
SHA256_A = hashlib.sha256(b"a").hexdigest()


# -- writing lines ----------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "line"), [
    ("plain", b"%s  plain\n"),
    (" lead space", b"%s   lead space\n"),
    ("*star", b"%s  *star\n"),
    ("tab\tx", b"%s  tab\tx\n"),
    ("back\\slash", b"\\%s  back\\\\slash\n"),
    ("new\nline", b"\\%s  new\\nline\n"),
    ("cr\rx", b"\\%s  cr\\rx\n"),
    ("a\r\nb\\", b"\\%s  a\\r\\nb\\\\\n"),
])
def test_sum_line_is_coreutils_text_mode(path: str, line: bytes) -> None:
    # the escaped forms are what md5sum (coreutils 9.1) printed for these names on this VM
    assert sum_line(MD5_A, path) == line % MD5_A.encode()


def test_blake3_lines_escape_like_b3sum() -> None:
    assert sum_line("ab" * 32, "cr\rx", "blake3") == b"%s  cr\rx\n" % (b"ab" * 32)
    assert sum_line("ab" * 32, "n\\l\n", "blake3") == b"\\%s  n\\\\l\\n\n" % (b"ab" * 32)


def test_a_name_that_is_not_utf8_is_written_as_its_bytes() -> None:
    path = os.fsdecode(b"caf\xe9")
    assert sum_line(MD5_A, path) == MD5_A.encode() + b"  caf\xe9\n"


def test_check_line_escapes_only_names_with_a_newline() -> None:
    assert check_line("back\\slash", "OK") == b"back\\slash: OK\n"
    assert check_line("cr\rx", "FAILED") == b"cr\rx: FAILED\n"
    assert check_line("a\r\nb\\", "OK") == b"\\a\\r\\nb\\\\: OK\n"
    assert check_line("gone", "FAILED open or read") == b"gone: FAILED open or read\n"


def test_warnings_word_like_md5sum() -> None:
    assert check_warnings(0, 0, 0) == []
    assert check_warnings(1, 1, 1) == [
        "WARNING: 1 line is improperly formatted",
        "WARNING: 1 listed file could not be read",
        "WARNING: 1 computed checksum did NOT match"]
    assert check_warnings(2, 3, 1234) == [
        "WARNING: 2 lines are improperly formatted",
        "WARNING: 3 listed files could not be read",
        "WARNING: 1,234 computed checksums did NOT match"]


# -- reading lines ----------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "name"), [
    (b"%s  plain", b"plain"),
    (b"%s *plain", b"plain"),  # binary marker
    (b"%s plain", b"plain"),  # one space, as `md5 -r` writes
    (b"%s\tplain", b"plain"),
    (b"  %s  plain", b"plain"),  # leading blanks
    (b"%s  plain\r", b"plain"),  # CRLF file
    (b"%s   plain", b" plain"),  # marker, then a name starting with a space
    (b"%s **plain", b"*plain"),
    (b"%s  plain\\", b"plain\\"),  # not escaped: a backslash is a backslash
    (b"\\%s  back\\\\slash", b"back\\slash"),
    (b"\\%s  a\\r\\nb", b"a\r\nb"),
    (b"MD5 (pl ain) = %s", b"pl ain"),
    (b"MD5(plain)= %s", b"plain"),
    (b"\\MD5 (back\\\\slash) = %s", b"back\\slash"),
])
def test_parse_reads_what_md5sum_c_reads(line: bytes, name: bytes) -> None:
    parsed = parse_line(line % MD5_A.encode())
    assert parsed is not None
    assert (parsed.hexdigest, parsed.name) == (MD5_A, name)


@pytest.mark.parametrize("line", [
    b"%s",  # no name
    b"%sx  plain",  # not hex
    b"%s0  plain",  # 33 digits
    b"\\%s  bad\\x",  # an escape md5sum does not know
    b"\\%s  trailing\\",
    b"md5 (plain) = %s",  # tags are upper case
    b"%s\0  plain",
    b"   ",
])
def test_parse_refuses_what_md5sum_c_refuses(line: bytes) -> None:
    assert parse_line(line % MD5_A.encode() if b"%s" in line else line) is None


def test_parse_accepts_upper_case_hex_and_gives_lower() -> None:
    parsed = parse_line(MD5_A.upper().encode() + b"  x")
    assert parsed is not None and parsed.hexdigest == MD5_A


def read(text: bytes, algo: str | None = None) -> tuple[list[CheckEntry], ChecksumReader]:
    reader = ChecksumReader(io.BytesIO(text), algo)
    return list(reader), reader


def test_reader_infers_the_algorithm_from_the_first_line() -> None:
    entries, reader = read(b"# made by hand\n\n%s  a\n%s  b\nnonsense\n%s  c"
                           % (SHA1_A.encode(), MD5_A.encode(), SHA1_A.encode()))
    assert reader.algo == "sha1"
    assert entries == [CheckEntry("a", SHA1_A), CheckEntry("c", SHA1_A)]
    assert reader.improper == 2  # the md5 line and the nonsense; not the comment or blank


def test_reader_reads_64_digits_as_sha256_unless_told_blake3() -> None:
    text = b"%s  a\n" % SHA256_A.encode()
    assert read(text)[1].algo == "sha256"
    entries, reader = read(text, "blake3")
    assert reader.algo == "blake3" and entries == [CheckEntry("a", SHA256_A)]
    assert read(b"SHA256 (a) = %s\n" % SHA256_A.encode(), "blake3")[1].improper == 1


def test_reader_with_a_given_algorithm_refuses_other_lengths() -> None:
    entries, reader = read(b"%s  a\n%s  b\n" % (MD5_A.encode(), SHA256_A.encode()), "sha256")
    assert entries == [CheckEntry("b", SHA256_A)] and reader.improper == 1


def test_reader_skips_an_overlong_line_and_goes_on() -> None:
    long = b"%s  %s\n" % (MD5_A.encode(), b"x" * (3 << 16))
    entries, reader = read(long + b"%s  b\n" % MD5_A.encode())
    assert entries == [CheckEntry("b", MD5_A)] and reader.improper == 1


def test_reader_decodes_names_that_are_not_utf8_reversibly() -> None:
    entries, _ = read(b"%s  caf\xe9\n" % MD5_A.encode())
    assert os.fsencode(entries[0].path) == b"caf\xe9"


def test_reader_refuses_an_unknown_algorithm() -> None:
    with pytest.raises(UsageError):
        ChecksumReader(io.BytesIO(b""), "crc32")


# -- walking and batching ---------------------------------------------------------------------

def make_tree(root: Path) -> None:
    (root / "b").mkdir(parents=True)
    (root / "b" / "z").write_bytes(b"z" * 10)
    (root / "b" / "a").write_bytes(b"a")
    (root / "a-b").write_bytes(b"ab")
    (root / "B").write_bytes(b"B")
    (root / "empty").mkdir()
    (root / "link-to-file").symlink_to("a-b")
    (root / "link-to-dir").symlink_to("b")
    (root / "dangling").symlink_to("nowhere")
    os.mkfifo(root / "fifo")


def test_walk_is_sorted_by_bytes_and_follows_only_file_links(tmp_path: Path) -> None:
    make_tree(tmp_path)
    top = str(tmp_path)
    assert list(walk([top])) == [
        (f"{top}/B", 1), (f"{top}/a-b", 2), (f"{top}/b/a", 1), (f"{top}/b/z", 10),
        (f"{top}/link-to-file", 2)]


def test_walk_leaves_out_a_downloads_state_unless_it_is_named(tmp_path: Path) -> None:
    """DEST/.bulkfetch (journal, sums, locks) changes with every run: `hash DEST > sums`
    then `hash --check sums` failed on it after a rerun. Named as a PATH, it is hashed."""
    (tmp_path / "data").write_bytes(b"12")
    (tmp_path / "sub" / ".bulkfetch").mkdir(parents=True)
    (tmp_path / "sub" / ".bulkfetch" / "journal.sqlite").write_bytes(b"123")
    (tmp_path / ".bulkfetch").mkdir()
    (tmp_path / ".bulkfetch" / "lock").write_bytes(b"1")
    top = str(tmp_path)
    assert list(walk([top])) == [(f"{top}/data", 2)]
    assert list(walk([f"{top}/.bulkfetch"])) == [(f"{top}/.bulkfetch/lock", 1)]


def test_walk_keeps_paths_in_the_order_given_and_reports_missing_in_place(
        tmp_path: Path) -> None:
    make_tree(tmp_path)
    jobs = list(walk([str(tmp_path / "b" / "z"), str(tmp_path / "gone"), str(tmp_path / "b")]))
    assert jobs == [(str(tmp_path / "b" / "z"), 10), (str(tmp_path / "gone"), -errno.ENOENT),
                    (str(tmp_path / "b" / "a"), 1), (str(tmp_path / "b" / "z"), 10)]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_walk_reports_a_directory_it_cannot_list(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        assert list(walk([str(tmp_path)])) == [(str(locked), -errno.EACCES)]
    finally:
        locked.chmod(0o755)


def test_batches_close_on_count_bytes_and_group() -> None:
    items = [("a", 1), ("b", 1), ("c", 1), ("big", 100), ("d", 1), ("e", -2)]
    assert list(batched(items, lambda i: i[1], files=2, nbytes=50)) == [
        [("a", 1), ("b", 1)], [("c", 1)], [("big", 100)], [("d", 1), ("e", -2)]]
    grouped = list(batched([(1, "x"), (2, "x"), (3, "y")], lambda i: 0, files=10, nbytes=10,
                           group_of=lambda i: i[1]))
    assert grouped == [[(1, "x"), (2, "x")], [(3, "y")]]


# -- the pool ---------------------------------------------------------------------------------

def slow_first(tick: hashing.Tick) -> object:
    """Work whose answers come back out of order: batch 0 sleeps, the others do not."""
    def work(batch: list[int]) -> list[str]:
        if batch[0] == 0:
            time.sleep(0.5)
        tick(len(batch))
        return [f"r{n}" for n in batch]
    return work


def test_pool_gives_results_in_order_with_a_bounded_window() -> None:
    pulled: list[int] = []

    def source() -> object:
        for n in range(40):
            pulled.append(n)
            yield [n], n

    order: list[int] = []
    with WorkerPool(2, slow_first, window=4) as pool:  # type: ignore[arg-type]
        for context, digests in pool.map(source()):  # type: ignore[arg-type]
            if not order:
                # while batch 0 slept the other worker answered batches 1..3, and no more
                # was taken from the source than the window and the one made ready
                assert len(pulled) <= 4 + 1
            order.append(context)
            assert digests == [f"r{context}"]
        assert pool.bytes_done() == 40
    assert order == list(range(40))


def dies_on_three(tick: hashing.Tick) -> object:
    def work(batch: list[int]) -> list[str]:
        if batch[0] == 3:
            os._exit(7)
        if batch[0] == 103:  # as a mapped file truncated under BLAKE3 ends it
            os.kill(os.getpid(), signal.SIGBUS)
        return ["ok"]
    return work


@pytest.mark.parametrize(("first", "status"), [(0, 7), (100, -signal.SIGBUS)])
def test_pool_stops_with_an_error_when_a_worker_dies(first: int, status: int) -> None:
    named = rf"stopped unexpectedly \(exit status {status}\) while it read batch {first + 3};"
    with pytest.raises(BulkfetchError, match=named), \
            WorkerPool(2, dies_on_three, describe=lambda n: f"batch {n}") as pool:  # type: ignore[arg-type]
        list(pool.map(([n], n) for n in range(first, first + 10)))  # type: ignore[arg-type]


def test_pool_leaves_no_process_behind() -> None:
    with WorkerPool(3, slow_first) as pool:  # type: ignore[arg-type]
        assert list(pool.map(([n], n) for n in range(1, 5)))  # type: ignore[arg-type]
        pids = [worker.pid for worker in pool._workers]
    assert len(pids) == 3 and set(pool._exit_codes) == set(pids)  # every one reaped
    assert set(pool._exit_codes.values()) == {0}  # each left when told, none was killed
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def stuck_on_one(tick: hashing.Tick) -> object:
    def work(batch: list[int]) -> list[str]:
        if batch[0] == 1:
            time.sleep(60)
        return ["ok"]
    return work


def test_pool_stops_busy_workers_when_the_run_is_cut_short() -> None:
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), \
            WorkerPool(2, stuck_on_one) as pool:  # type: ignore[arg-type]
        for _ in pool.map(([n], n) for n in range(4)):  # type: ignore[arg-type]
            raise KeyboardInterrupt  # Ctrl-C at the first answer: batch 1 is still running
    codes = list(pool._exit_codes.values())  # (the idle one may leave before its SIGTERM)
    assert len(codes) == 2 and -signal.SIGTERM in codes and set(codes) <= {0, -signal.SIGTERM}
    assert time.monotonic() - started < 10  # stopped, not waited for


def test_pool_forks_only_as_many_workers_as_there_are_batches() -> None:
    with WorkerPool(4, slow_first) as pool:  # type: ignore[arg-type]
        assert not pool._workers  # nothing forked before there is work
        assert list(pool.map([([1], 1)])) == [(1, ["r1"])]  # type: ignore[arg-type]
        assert len(pool._workers) == 1


# -- the runs on real files -------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["md5", "sha1", "sha256"])
def test_hash_paths_matches_hashlib_in_order(tmp_path: Path, algo: str) -> None:
    bodies = {f"f{i:03d}": os.urandom(i * 977) for i in range(60)}
    bodies["big"] = os.urandom(3 * hashing.CHUNK + 17)  # chunks, a tail, fadvise
    for name, body in bodies.items():
        (tmp_path / name).write_bytes(body)
    progress = HashProgress()
    options = HashOptions(algo=algo, workers=3, batch_files=7, batch_bytes=50_000)
    got = list(hash_paths([str(tmp_path)], options, progress))
    assert [Path(p).name for p, _ in got] == sorted(bodies)
    assert {Path(p).name: d for p, d in got} == {
        name: hashlib.new(algo, body).hexdigest() for name, body in bodies.items()}
    assert progress.read_bytes() == sum(map(len, bodies.values()))
    assert (progress.files_done, progress.listed_files) == (61, 61) and progress.listing_done


def test_hash_paths_reports_unreadable_files_in_place(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    got = list(hash_paths([str(tmp_path / "a"), str(tmp_path / "gone"), str(tmp_path)],
                          HashOptions(workers=2), HashProgress()))
    assert got[0] == (str(tmp_path / "a"), MD5_A)
    assert got[1][0] == str(tmp_path / "gone")
    assert isinstance(got[1][1], OSError) and got[1][1].errno == errno.ENOENT
    assert got[2] == (str(tmp_path / "a"), MD5_A)


def test_blake3_matches_the_package_for_small_and_threaded_files(tmp_path: Path) -> None:
    blake3 = pytest.importorskip("blake3").blake3
    small = os.urandom(100_000)
    big = os.urandom(hashing.BLAKE3_THREADS_ABOVE + 12345)  # mapped, on all cores
    (tmp_path / "small").write_bytes(small)
    (tmp_path / "big").write_bytes(big)
    (tmp_path / "empty").write_bytes(b"")
    got = dict(hash_paths([str(tmp_path)], HashOptions(algo="blake3", workers=2),
                          HashProgress()))
    assert got == {str(tmp_path / "big"): blake3(big).hexdigest(),
                   str(tmp_path / "empty"): blake3(b"").hexdigest(),
                   str(tmp_path / "small"): blake3(small).hexdigest()}


def test_a_mapped_blake3_file_is_counted_slice_by_slice(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    blake3 = pytest.importorskip("blake3").blake3
    monkeypatch.setattr(hashing, "BLAKE3_SLICE", 1 << 20)
    body = os.urandom(hashing.BLAKE3_THREADS_ABOVE + 12345)
    (tmp_path / "big").write_bytes(body)
    ticks: list[int] = []
    hasher = hashing._FileHasher("blake3", ticks.append)
    assert hasher([(str(tmp_path / "big"), len(body))]) == [blake3(body).hexdigest()]
    assert len(ticks) == 33 and sum(ticks) == len(body)  # the bar moves within the file


def test_check_entries_hash_the_listed_paths(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    entries = [CheckEntry(str(tmp_path / "a"), MD5_A), CheckEntry(str(tmp_path / "no"), MD5_A),
               CheckEntry(str(tmp_path), MD5_A)]
    got = list(check_entries(entries, "md5", HashOptions(workers=2), HashProgress()))
    assert [entry for entry, _ in got] == entries
    assert got[0][1] == MD5_A
    assert isinstance(got[1][1], OSError) and got[1][1].errno == errno.ENOENT
    assert isinstance(got[2][1], OSError) and got[2][1].errno == errno.EISDIR  # as md5sum -c


SHARDS = [[(f"s0/{i}", os.urandom(i * 300)) for i in range(40)],
          [("big", os.urandom(2 * hashing.CHUNK + 5)), ("zero", b"")]]


def verify(dest: Path) -> dict[str, object]:
    with open_dataset(dest) as data:
        return {info.name: digest for info, digest in verify_members(
            data.infos(), dest, HashOptions(workers=2, batch_files=8), HashProgress())}


def test_verify_members_reads_each_member_by_offset(tmp_path: Path) -> None:
    write_tar_destination(tmp_path / "d", SHARDS)
    got = verify(tmp_path / "d")
    assert got == {name: hashlib.md5(body).hexdigest() for name, body in SHARDS[0] + SHARDS[1]}


def test_verify_members_refuses_a_shard_name_outside_dest(tmp_path: Path) -> None:
    import sqlite3

    dest = tmp_path / "d"
    write_tar_destination(dest, SHARDS)
    with sqlite3.connect(dest / "index.sqlite") as conn:
        conn.execute("UPDATE shards SET file = '../../etc/passwd' WHERE id = 1")
    got = verify(dest)
    bad = [name for name, digest in got.items() if isinstance(digest, OSError)]
    assert sorted(bad) == sorted(name for name, _ in SHARDS[0])
    assert "no valid shard file" in str(got["s0/1"])
    assert got["big"] == hashlib.md5(SHARDS[1][0][1]).hexdigest()


def test_verify_members_reports_a_truncated_shard(tmp_path: Path) -> None:
    dest = tmp_path / "d"
    rows = write_tar_destination(dest, SHARDS)
    name, offset, size, _ = rows[0][-1]
    shard = dest / "shard-000-000001.tar"
    os.truncate(shard, offset + size // 2)
    got = verify(dest)
    assert "truncated" in str(got[name])
    assert got["s0/1"] == hashlib.md5(SHARDS[0][1][1]).hexdigest()


# -- the bar ----------------------------------------------------------------------------------

def test_the_bar_shows_bytes_against_what_is_listed_so_far() -> None:
    from rich.console import Console

    from bulkfetch.cli.hash import _Bar

    progress = HashProgress(started=time.monotonic() - 2, listed_files=10,
                            listed_bytes=4_000_000, files_done=4, failed=1,
                            read_bytes=lambda: 1_000_000)
    console = Console(file=io.StringIO(), width=120, color_system=None)
    bar = _Bar(progress, redirect_stdout=False)  # not started: rendered by hand

    def shown() -> str:
        console.file = io.StringIO()
        console.print(bar)
        return console.file.getvalue()

    text = shown()
    assert "25.0%" in text and "1.0 MB / 4.0 MB+" in text and "--:--:--" in text
    assert "4 / 10+ files · 1 failed" in text
    time.sleep(0.1)
    progress.listing_done = True
    progress.read_bytes = lambda: 2_000_000
    text = shown()  # 1 MB more in about 0.1 s: an ETA of about 0.2 s
    assert "50.0%" in text and "4.0 MB+" not in text and "ETA 00:00:00" in text


@pytest.mark.parametrize("paths", [
    ["plain", "a/b", "space name"],  # the one-pass path
    ["plain", "back\\slash"], ["new\nline", "x"], ["cr\rx"], [os.fsdecode(b"caf\xe9")], []])
def test_a_batch_of_sum_lines_is_the_lines_one_by_one(paths: list[str]) -> None:
    entries = [(hashlib.md5(p.encode(errors="surrogateescape")).hexdigest(), p) for p in paths]
    assert sum_lines(entries) == b"".join(sum_line(d, p) for d, p in entries)


def test_a_batch_is_named_by_its_largest_file_when_its_worker_dies() -> None:
    assert hashing._named([("/d/only", 5)]) == "/d/only"
    assert hashing._named([("/d/a", 1), ("/d/big", 9), ("/d/c", 2)]) == \
        "/d/big (or one of the 2 other files of its batch)"
