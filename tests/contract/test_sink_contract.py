"""The contract every Sink keeps (sinks/base.py), checked for every implementation on a DEST
prepared as a run prepares it, in the style of rclone's fstests: one set of tests,
parametrised over the sinks (null, dir, dir with fanout and fsync, tar, tar with shards of
three files, and the stream sinks of bulkfetch.stream(), a page a message or a body a message).

- Bodies written through a page's Writer, or streamed through a spool and stored, read back
  byte-exact (files; tar members by tarfile); the null sink stores nothing.
- end_page()/ready()/flush() release every ended page's report exactly once, and only when
  its files can be read back (a released page is never fetched again).
- Names with subdirectories, non-ASCII (NFC and NFD apart), and the longest name
  check_name() allows round-trip; pages and workers sharing DEST do not clobber each other;
  a name that collides with a directory (or a file) fails alone.
- A discarded spool leaves nothing; a partial file survives a new sink and stores like a
  spool; after close() nothing temporary is left, only the sink's own bookkeeping.
- A sink closed mid-page (a crash: no end_page, no flush) leaves no partial body under a
  final name.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Sequence

from contract_sinks import SinkHarness

from bulkfetch.engine.resume import partial_key
from bulkfetch.models import Failure, PageReport
from bulkfetch.sinks.base import Sink, SinkFailure
from bulkfetch.util.names import NAME_MAX, PATH_MAX, check_name
from bulkfetch.util.samples import split_key

CHUNK = 64 << 10


def md5(body: bytes) -> str:
    return hashlib.md5(body).hexdigest()


def bodies_for(names: Sequence[str], seed: int, largest: int = 3000) -> dict[str, bytes]:
    """A body per name, 0 to `largest` bytes (0 included: an empty file is a file)."""
    chance = random.Random(seed)
    return {name: chance.randbytes(0 if at == 0 else chance.randint(1, largest))
            for at, name in enumerate(names)}


def report_of(seq: int, bodies: dict[str, bytes], failed: Sequence[str] = ()) -> PageReport:
    failures = tuple(Failure(name, "failed in the test", 1) for name in failed)
    return PageReport(seq, len(bodies), sum(map(len, bodies.values())), failures)


class Releases:
    """Every report a sink released, in order, checked as it comes: a page is released
    once, only after it ended, and only once its files read back (durable)."""

    def __init__(self, harness: SinkHarness) -> None:
        self.harness = harness
        self.ended: dict[int, dict[str, bytes]] = {}
        self.released: list[int] = []

    def take(self, reports: list[PageReport]) -> None:
        for report in reports:
            assert report.seq in self.ended, f"page {report.seq} released before it ended"
            assert report.seq not in self.released, f"page {report.seq} released twice"
            self.released.append(report.seq)
        if reports and self.harness.case.abilities.keeps:
            stored = self.harness.stored_map()
            for report in reports:
                for name, body in self.ended[report.seq].items():
                    assert stored.get(name) == body, \
                        f"page {report.seq} released while {name!r} does not read back"

    def end(self, sink: Sink, seq: int, bodies: dict[str, bytes],
            failed: Sequence[str] = ()) -> None:
        self.ended[seq] = bodies
        self.take(sink.end_page(report_of(seq, bodies, failed)))
        self.take(sink.ready())

    def flush(self, sink: Sink) -> None:
        self.take(sink.flush())

    def assert_all_released(self) -> None:
        # each once (take() refuses a second release), and every ended page
        assert sorted(self.released) == sorted(self.ended), \
            f"released {sorted(self.released)}, ended {sorted(self.ended)}"


def write_page(sink: Sink, releases: Releases, seq: int, bodies: dict[str, bytes],
               order: Sequence[str] | None = None) -> None:
    """A page as the fetcher writes it: begun with its names in listing order, bodies in
    the order their transfers end (`order`), then ended."""
    write = sink.begin_page(seq, list(bodies))
    for name in order if order is not None else bodies:
        write(name, bodies[name], md5(bodies[name]))
    releases.end(sink, seq, bodies)


def assert_stored_exactly(harness: SinkHarness, expected: dict[str, bytes]) -> None:
    stored = harness.stored_map()
    if not harness.case.abilities.keeps:
        assert stored == {}, f"the null sink stored {sorted(stored)[:5]}"
        return
    missing = sorted(set(expected) - set(stored))
    extra = sorted(set(stored) - set(expected))
    wrong = sorted(name for name in set(expected) & set(stored)
                   if stored[name] != expected[name])
    assert not (missing or extra or wrong), \
        f"missing {missing[:3]}, unexpected {extra[:3]}, wrong bytes {wrong[:3]}"


def assert_nothing_temporary(harness: SinkHarness, written: set[str]) -> None:
    assert harness.temporaries() == [], "temporary files left after close()"
    assert harness.state_entries() == [], "unexpected entries in DEST/.bulkfetch"
    assert harness.strangers(written) == [], "unexpected entries in DEST"


# -- bodies in, bodies out ----------------------------------------------------------------------

def close_and_check(harness: SinkHarness, sink: Sink, releases: Releases,
                    stored: dict[str, bytes]) -> None:
    """The end of a clean run: every page released once, the sink closed, exactly `stored`
    readable, nothing temporary left."""
    releases.flush(sink)
    releases.assert_all_released()
    harness.close(sink)
    assert_stored_exactly(harness, stored)
    assert_nothing_temporary(harness, set(stored))

def test_a_page_of_small_bodies_reads_back_byte_exact_and_is_released_once(
        harness: SinkHarness) -> None:
    sink = harness.open()
    releases = Releases(harness)
    names = [f"f{i:04d}" for i in range(12)] + [f"sub/dir/g{i:02d}.bin" for i in range(8)]
    bodies = bodies_for(names, seed=1)
    # transfers end in any order: the last listed first
    write_page(sink, releases, 1, bodies, order=list(reversed(names)))
    close_and_check(harness, sink, releases, bodies)


def test_many_pages_are_each_released_once_and_only_when_their_files_read_back(
        harness: SinkHarness) -> None:
    sink = harness.open()
    releases = Releases(harness)
    everything: dict[str, bytes] = {}
    for seq in range(1, 9):
        bodies = bodies_for([f"p{seq}/f{i}" for i in range(4)], seed=seq)
        write_page(sink, releases, seq, bodies)
        everything |= bodies
    # a page whose every file failed, and a page with no file at all (both happen)
    write = sink.begin_page(9, ["lost/a", "lost/b"])
    del write
    for name in ("lost/a", "lost/b"):
        sink.skip(9, name)
    releases.end(sink, 9, {}, failed=["lost/a", "lost/b"])
    sink.begin_page(10, [])
    releases.end(sink, 10, {})
    close_and_check(harness, sink, releases, everything)


def test_a_skipped_name_is_not_stored_and_the_rest_of_its_page_is(
        harness: SinkHarness) -> None:
    sink = harness.open()
    releases = Releases(harness)
    # webdataset samples: members sharing a key (tar keeps them together, ordered.py)
    names = [f"s/{key:04d}.{ext}" for key in range(6) for ext in ("jpg", "json", "txt")]
    bodies = bodies_for(names, seed=3)
    failed = "s/0002.json"
    write = sink.begin_page(1, names)
    for name in reversed(names):
        if name == failed:
            sink.skip(1, name)
        else:
            write(name, bodies[name], md5(bodies[name]))
    kept = {name: body for name, body in bodies.items() if name != failed}
    releases.end(sink, 1, kept, failed=[failed])
    releases.flush(sink)
    releases.assert_all_released()
    harness.close(sink)
    assert_stored_exactly(harness, kept)
    if harness.case.abilities.ordered:
        # whole samples, in listing order (sinks/ordered.py): webdataset reads them whole
        keys = [split_key(name)[0] for name, _ in harness.stored()]
        assert keys == sorted(keys), f"samples out of order or split: {keys}"


def test_a_big_body_streamed_through_a_spool_lands_byte_exact(harness: SinkHarness) -> None:
    sink = harness.open()
    releases = Releases(harness)
    big = random.Random(4).randbytes(3 * 1024 * 1024 + 12345)
    small = {"small/one": b"beside the big one"}
    write = sink.begin_page(1, ["big/file.bin", "small/one"])
    spool = sink.open_spool("big/file.bin")
    for start in range(0, len(big), CHUNK):
        spool.write(big[start:start + CHUNK])
    write("small/one", small["small/one"], md5(small["small/one"]))
    sink.store_spool(1, "big/file.bin", spool, len(big), md5(big))
    releases.end(sink, 1, {"big/file.bin": big, **small})
    close_and_check(harness, sink, releases, {"big/file.bin": big, **small})


def test_a_spooled_body_nobody_hashed_is_stored_all_the_same(harness: SinkHarness) -> None:
    """md5 "" (--no-verify, or a pinned SHA-256 was the check): the body is stored as any
    other. A sink that keeps every body's MD5 says so (needs_md5), and the engine then
    always hashes for it (test_get_jsonapi, test_get_bigfiles check that end to end)."""
    sink = harness.open()
    assert isinstance(sink.needs_md5, bool)
    releases = Releases(harness)
    big = random.Random(6).randbytes(2 * 1024 * 1024 + 777)
    sink.begin_page(1, ["unhashed.bin"])
    spool = sink.open_spool("unhashed.bin")
    for start in range(0, len(big), CHUNK):
        spool.write(big[start:start + CHUNK])
    sink.store_spool(1, "unhashed.bin", spool, len(big), md5(big) if sink.needs_md5 else "")
    releases.end(sink, 1, {"unhashed.bin": big})
    close_and_check(harness, sink, releases, {"unhashed.bin": big})


def test_a_discarded_spool_leaves_nothing_behind(harness: SinkHarness) -> None:
    sink = harness.open()
    releases = Releases(harness)
    kept = {"kept": b"the page's other file"}
    write = sink.begin_page(1, ["abandoned.bin", "kept"])
    spool = sink.open_spool("abandoned.bin")
    spool.write(b"x" * (2 * CHUNK))
    spool.discard()
    spool.discard()  # safe to call twice (a failed transfer, then the page's cleanup)
    sink.skip(1, "abandoned.bin")
    write("kept", kept["kept"], md5(kept["kept"]))
    releases.end(sink, 1, kept, failed=["abandoned.bin"])
    close_and_check(harness, sink, releases, kept)


def test_a_partial_file_is_kept_for_the_next_sink_and_stores_like_a_spool(
        harness: SinkHarness) -> None:
    """open_partial(): a big file fetched by ranges (engine/big.py) writes where a rerun
    finds it again; completed, it is published by store_spool()."""
    name = "ranged/huge.bin"
    body = random.Random(5).randbytes(2 * 1024 * 1024 + 77)
    half = len(body) // 2
    first = harness.open()
    first.begin_page(1, [name])
    partial = first.open_partial(partial_key(name))
    # only a sink that declares it resumes keeps partial bytes (null and stream do not)
    assert (partial is not None) == harness.case.abilities.resumes
    if partial is None:
        harness.close(first)
        return
    partial.write_at(body[half:], half)  # parts arrive in any order
    partial.close()
    harness.close(first)  # the run stops (or is killed) before the file is complete

    second = harness.open()
    releases = Releases(harness)
    second.begin_page(1, [name])
    resumed = second.open_partial(partial_key(name))
    assert resumed is not None
    # created when missing, kept when there: the second half survived, nothing was cut
    assert os.fstat(resumed.fd).st_size == len(body)
    assert os.pread(resumed.fd, len(body) - half, half) == body[half:]
    resumed.write_at(body[:half], 0)
    second.store_spool(1, name, resumed, len(body), md5(body))
    releases.end(second, 1, {name: body})
    close_and_check(harness, second, releases, {name: body})


# -- names --------------------------------------------------------------------------------------
def longest_names() -> list[str]:
    """Names at check_name()'s limits: components of NAME_MAX bytes (ASCII, and two-byte
    UTF-8), the whole name PATH_MAX bytes."""
    ascii_component = "a" * NAME_MAX
    wide_component = "é" * (NAME_MAX // 2) + "z" * (NAME_MAX % 2)
    directory = "d" * NAME_MAX  # not a name of the others: a file cannot be a directory
    deep: list[str] = []
    while len("/".join([*deep, directory]).encode()) + 1 + 1 <= PATH_MAX:
        deep.append(directory)
    room = PATH_MAX - len("/".join(deep).encode()) - 1
    longest = "/".join([*deep, "b" * min(room, NAME_MAX)])
    return [ascii_component, wide_component, f"w/{wide_component}/{ascii_component}", longest]


def test_subdirectories_unicode_and_the_longest_allowed_names_round_trip(
        harness: SinkHarness) -> None:
    names = ["a/b/c/d/e/deep.bin", "ünïcödé/日本語.txt", "emoji-🙂.dat", "caf\u00e9",
             "cafe\u0301", "with space/and,comma;semicolon", "dots.in.the.middle.tar.gz",
             *longest_names()]
    assert max(len(name.encode()) for name in names) == PATH_MAX
    for name in names:  # the sink is only ever given names check_name() accepts
        assert check_name(name) is None, (name[:40], check_name(name))
    sink = harness.open()
    releases = Releases(harness)
    bodies = bodies_for(names, seed=6)
    write_page(sink, releases, 1, bodies)
    releases.flush(sink)
    releases.assert_all_released()
    harness.close(sink)
    assert_stored_exactly(harness, bodies)


def test_pages_and_workers_sharing_dest_do_not_clobber_each_other(
        harness: SinkHarness) -> None:
    # Two workers' sinks on one DEST, as a run has them, pages interleaved; names that
    # share directories and prefixes.
    workers = [harness.open(worker=0), harness.open(worker=1)]
    releases = [Releases(harness), Releases(harness)]
    everything: dict[str, bytes] = {}
    pages = [["d/x", "d/y", "top"], ["d/x2", "d/z/w", "top2"], ["d/x.1", "e/x", "top.txt"],
             ["d/z/w2", "e/y", "f"]]
    for seq, names in enumerate(pages, 1):
        bodies = bodies_for(names, seed=10 + seq)
        worker = seq % 2
        write_page(workers[worker], releases[worker], seq, bodies)
        everything |= bodies
    for worker, sink in enumerate(workers):
        releases[worker].flush(sink)
        releases[worker].assert_all_released()
        harness.close(sink)
    assert_stored_exactly(harness, everything)
    assert_nothing_temporary(harness, set(everything))


def test_a_name_colliding_with_a_directory_or_a_file_fails_alone(
        harness: SinkHarness) -> None:
    """`h/x` then `h/x/y` (a file where a directory must go) and `d/inner` then `d`: a
    sink that cannot keep both raises SinkFailure for that one name, and what it stored
    before stays whole."""
    sink = harness.open()
    releases = Releases(harness)
    names = ["h/x", "h/x/y", "d/inner", "d", "other"]
    bodies = bodies_for(names, seed=20)
    write = sink.begin_page(1, names)
    stored: dict[str, bytes] = {}
    failed: list[str] = []
    for name in names:
        try:
            write(name, bodies[name], md5(bodies[name]))
        except SinkFailure as exc:
            assert str(exc), "a SinkFailure says why"
            sink.skip(1, name)
            failed.append(name)
        else:
            stored[name] = bodies[name]
    assert "other" in stored and "h/x" in stored and "d/inner" in stored
    releases.end(sink, 1, stored, failed=failed)
    releases.flush(sink)
    releases.assert_all_released()
    harness.close(sink)
    assert_stored_exactly(harness, stored)


# -- crashes ------------------------------------------------------------------------------------
def test_a_sink_closed_mid_page_leaves_no_partial_body_under_a_final_name(
        harness: SinkHarness) -> None:
    sink = harness.open()
    releases = Releases(harness)
    done = bodies_for([f"done/f{i}" for i in range(5)], seed=30)
    write_page(sink, releases, 1, done)
    # page 2 is cut off: some files written, a big one half spooled, no end_page, no flush
    cut = bodies_for([f"cut/f{i}" for i in range(5)], seed=31)
    write = sink.begin_page(2, [*cut, "cut/big.bin"])
    for name in list(cut)[:3]:
        write(name, cut[name], md5(cut[name]))
    spool = sink.open_spool("cut/big.bin")
    spool.write(b"half of a big body" * 4096)
    releases.take(sink.ready())
    harness.close(sink)

    stored = harness.stored_map()
    written = done | {name: cut[name] for name in list(cut)[:3]}
    for name, body in stored.items():
        assert name in written, f"{name!r} stored, but its body was never complete"
        assert body == written[name], f"{name!r} holds a partial or wrong body"
    # what was released before the crash stays: the journal will not fetch it again
    for seq in releases.released if harness.case.abilities.keeps else ():
        for name, body in releases.ended[seq].items():
            assert stored.get(name) == body, f"released page {seq} lost {name!r}"
    assert not [name for name in os.listdir(harness.dest) if name.endswith(".part")], \
        "a half-written shard kept in DEST"
