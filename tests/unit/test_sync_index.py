"""runners/sync.py's index on a real directory: MD5s from the sums (a later line wins), what a page
asks for (nothing for a file the listing shows unchanged, If-None-Match for a kept one,
plain for a missing one or a symlink), what --delete finds gone and removes (with the
directories it empties), and --max-delete's refusal, which removes nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bulkfetch.config import DeleteLimit
from bulkfetch.dest.validators import validator_lines
from bulkfetch.errors import UsageError
from bulkfetch.runners.sync import SyncIndex
from bulkfetch.util.checksum_lines import sum_lines
from bulkfetch.util.names import local_parts

MD5_A, MD5_B, MD5_C = "a" * 32, "b" * 32, "c" * 32


def dest_with(tmp_path: Path, files: dict[str, bytes], sums: list[list[tuple[str, str]]],
              fanout: int = 0) -> Path:
    dest = tmp_path / "dest"
    (dest / ".bulkfetch" / "sums").mkdir(parents=True)
    for name, body in files.items():
        path = dest.joinpath(*local_parts(name, fanout))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        stored = time.time() - 1000  # stored before its sums line was written, as by the sink
        os.utime(path, (stored, stored))
    for number, lines in enumerate(sums):  # older files first, as runs append them
        sums_file = dest / ".bulkfetch" / "sums" / f"w0-{number}.md5"
        sums_file.write_bytes(sum_lines([(md5, "/".join(local_parts(name, fanout)))
                                         for name, md5 in lines]))
        stamp = time.time() - 100 + number
        os.utime(sums_file, (stamp, stamp))
    return dest


def test_a_page_asks_only_for_what_may_have_changed(tmp_path: Path) -> None:
    dest = dest_with(tmp_path, {"a": b"1", "b": b"22", "sub/c": b"333"},
                     [[("a", MD5_C), ("b", MD5_B)], [("a", MD5_A), ("sub/c", MD5_C)]])
    (dest / "link").symlink_to(dest / "a")
    index = SyncIndex(dest, 0, new_pass=True)
    names = ["a", "b", "sub/c", "new", "link"]
    # no listing metadata: every kept file conditional, the rest plain
    keep, headers = index.plan(names, names, None, None)
    assert keep == [0, 1, 2, 3, 4]
    assert headers == (f'If-None-Match: "{MD5_A}"', f'If-None-Match: "{MD5_B}"',
                       f'If-None-Match: "{MD5_C}"', "", "")
    # a listing that states size and MD5: equal ones are not asked for at all
    keep, headers = index.plan(names, names, [1, 99, 3, 1, 1], [MD5_A, MD5_B, "", "", ""])
    assert keep == [1, 2, 3, 4] and index.unchanged == 1
    assert headers == (f'If-None-Match: "{MD5_B}"', f'If-None-Match: "{MD5_C}"', "", "")
    index.close()


def test_a_directory_listings_size_and_time_spare_what_did_not_change_since_stored(
        tmp_path: Path) -> None:
    dest = dest_with(tmp_path, {"a": b"1", "b": b"22", "c": b"333", "d": b"4"},
                     [[("a", MD5_A), ("b", MD5_B), ("c", MD5_C), ("d", MD5_A)]])
    index = SyncIndex(dest, 0, new_pass=True)
    stored = int(os.stat(next((dest / ".bulkfetch" / "sums").iterdir())).st_mtime)
    names = ["a", "b", "c", "d"]
    # a: same size, changed an hour before it was stored: spared. b: changed at the source
    # after it was stored. c: another size. d: a time within the listing's minute of the
    # store, which cannot tell before from after.
    keep, headers = index.plan(names, names, [1, 2, 4, 1], None,
                               mtimes=[stored - 3600, stored + 5, stored - 3600, stored - 30])
    assert keep == [1, 2, 3] and index.unchanged == 1
    assert headers == (f'If-None-Match: "{MD5_B}"', f'If-None-Match: "{MD5_C}"',
                       f'If-None-Match: "{MD5_A}"')
    # an unknown time or size (-1) spares nothing
    keep, _ = index.plan(names, names, [-1, 2, 3, 1], None, mtimes=[stored - 3600, -1, -1, -1])
    assert keep == [0, 1, 2, 3]
    index.close()


def test_kept_validators_ask_and_checksum_asks_by_content_alone(tmp_path: Path) -> None:
    """A file stored with its server's ETag, or only its Last-Modified (dest/validators.py),
    is asked for with it; --checksum asks by MD5 alone and spares nothing by size and time."""
    dest = dest_with(tmp_path, {"a": b"1", "b": b"22"}, [[("a", MD5_A), ("b", MD5_B)]])
    sums = next((dest / ".bulkfetch" / "sums").iterdir())
    date = "Sun, 29 Nov 2026 04:00:00 GMT"
    sums.with_suffix(".http").write_bytes(validator_lines([("a", '"e-1"', ""), ("b", "", date)]))
    stamp = sums.stat().st_mtime  # (the companion is read with its sums file)
    os.utime(sums, (stamp, stamp))
    index = SyncIndex(dest, 0, new_pass=True)
    stored = int(stamp)
    names = ["a", "b"]
    keep, headers = index.plan(names, names, None, None)
    assert keep == [0, 1]
    assert headers == ('If-None-Match: "e-1"', f"If-Modified-Since: {date}")
    index.close()
    checksum = SyncIndex(dest, 0, new_pass=True, checksum=True)
    keep, headers = checksum.plan(names, names, [1, 2], None,
                                  mtimes=[stored - 3600, stored - 3600])
    assert keep == [0, 1] and checksum.unchanged == 0
    assert headers == (f'If-None-Match: "{MD5_A}"', f'If-None-Match: "{MD5_B}"')
    keep, _ = checksum.plan(names, names, [1, 2], [MD5_A, MD5_C])  # the listing's MD5 holds
    assert keep == [1] and checksum.unchanged == 1
    checksum.close()


def test_what_the_pass_did_not_list_is_gone_and_removed_through_dir_fds(
        tmp_path: Path) -> None:
    names = {"keep": b"k", "dir/keep": b"k", "dir/old": b"o", "old": b"o"}
    dest = dest_with(tmp_path, names, [[(name, MD5_A) for name in names]], fanout=1)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    (dest / "ab").mkdir(exist_ok=True)
    (dest / "ab" / "to-outside").symlink_to(outside)  # a link to a directory is an entry
    index = SyncIndex(dest, 1, new_pass=True)
    index.plan(["keep", "dir/keep"], ["keep", "dir/keep"], None, None)
    gone = sorted(path for _, _, path in index.gone())
    local = {name: "/".join(local_parts(name, 1)) for name in names}
    assert gone == sorted([local["dir/old"], local["old"], "ab/to-outside"])
    shown: list[str] = []
    assert index.census(each=shown.append) == (3, 5)
    assert sorted(shown) == gone and all((dest / path).is_symlink() or (dest / path).exists()
                                         for path in gone)
    assert index.delete_gone() == 3
    assert not any(os.path.lexists(dest / path) for path in gone)
    assert (outside / "precious").read_text() == "x"
    assert (dest / local["keep"]).exists() and (dest / ".bulkfetch" / "sums").is_dir()
    index.close()


def test_listed_paths_survive_an_interrupted_pass_and_a_new_pass_forgets_them(
        tmp_path: Path) -> None:
    dest = dest_with(tmp_path, {"a": b"1", "b": b"2"}, [])
    first = SyncIndex(dest, 0, new_pass=True)
    first.plan(["a"], ["a"], None, None)
    first.close()
    resumed = SyncIndex(dest, 0, new_pass=False)  # the same pass, resumed
    assert [path for _, _, path in resumed.gone()] == ["b"]
    resumed.close()
    again = SyncIndex(dest, 0, new_pass=True)
    assert sorted(path for _, _, path in again.gone()) == ["a", "b"]
    again.close()


def test_a_pass_that_changed_dest_leaves_one_sums_line_per_file_it_holds(
        tmp_path: Path) -> None:
    dest = dest_with(tmp_path, {"a": b"1", "b": b"2", "old": b"o"},
                     [[("a", MD5_C), ("b", MD5_B), ("old", MD5_A)]])
    index = SyncIndex(dest, 0, new_pass=True)
    assert index.compact_sums() is False  # nothing changed: the sums stay as they are
    assert [p.name for p in (dest / ".bulkfetch" / "sums").iterdir()] == ["w0-0.md5"]
    index.plan(["a", "b"], ["a", "b"], None, None)
    # the pass fetched "a" again (a worker appended its new line) and "old" is gone
    (dest / ".bulkfetch" / "sums" / "w1-9.md5").write_bytes(sum_lines([(MD5_A, "a")]))
    assert index.delete_gone() == 1
    assert index.compact_sums() is True
    sums = list((dest / ".bulkfetch" / "sums").iterdir())
    assert len(sums) == 1 and sums[0].name.startswith("sums-")
    assert sums[0].read_bytes() == sum_lines([(MD5_A, "a"), (MD5_B, "b")])
    index.close()
    # the next start reads the rewritten sums as it read the old ones
    again = SyncIndex(dest, 0, new_pass=True)
    _, headers = again.plan(["a", "b"], ["a", "b"], None, None)
    assert headers == (f'If-None-Match: "{MD5_A}"', f'If-None-Match: "{MD5_B}"')
    again.close()


def test_lines_an_interrupted_pass_left_superseded_are_rewritten_by_the_next_pass(
        tmp_path: Path) -> None:
    dest = dest_with(tmp_path, {"a": b"1", "b": b"2"},
                     [[("a", MD5_C), ("b", MD5_B)], [("a", MD5_A)]])
    index = SyncIndex(dest, 0, new_pass=True)
    assert index.superseded == 1
    assert index.compact_sums() is True  # though this pass itself wrote nothing
    sums = list((dest / ".bulkfetch" / "sums").iterdir())
    assert [p.read_bytes() for p in sums] == [sum_lines([(MD5_A, "a"), (MD5_B, "b")])]
    assert index.compact_sums() is False
    index.close()


def test_the_listed_paths_vouch_only_for_the_pass_they_were_noted_in(tmp_path: Path) -> None:
    dest = dest_with(tmp_path, {"a": b"1"}, [])
    index = SyncIndex(dest, 0, new_pass=False)  # no sync pass was ever begun here
    assert not index.covers(None) and not index.covers(1.5)
    index.close()
    index = SyncIndex(dest, 0, new_pass=True)
    assert index.covers(None)  # begun, its first page not listed yet
    index.note_pass(1.5)
    index.note_pass(9.0)  # (only the first page's time counts)
    index.close()
    resumed = SyncIndex(dest, 0, new_pass=False)
    assert resumed.covers(1.5)
    assert not resumed.covers(2.5)  # another pass: a plain get's, after --restart
    resumed.close()


def test_removals_take_the_directories_they_empty_and_no_other(tmp_path: Path) -> None:
    names = {"a/b/old": b"o", "a/old": b"o", "c/old": b"o", "c/keep": b"k", "d/old": b"o"}
    dest = dest_with(tmp_path, names, [[(name, MD5_A) for name in names]])
    (dest / "users-empty").mkdir()  # empty before the pass: not the pass's to remove
    outside = tmp_path / "outside"
    (outside / "inner").mkdir(parents=True)
    (dest / "d" / "link").symlink_to(outside)  # removed as an entry; its target untouched
    index = SyncIndex(dest, 0, new_pass=True)
    index.plan(["c/keep"], ["c/keep"], None, None)
    assert index.delete_gone() == 5
    left = sorted(str(p.relative_to(dest)) for p in dest.rglob("*")
                  if ".bulkfetch" not in p.parts)
    assert left == ["c", "c/keep", "users-empty"]  # a/b, then a, and d went with their files
    assert (outside / "inner").is_dir()
    index.close()


def test_a_census_removes_nothing(tmp_path: Path) -> None:
    dest = dest_with(tmp_path, {"a/old": b"o"}, [])
    index = SyncIndex(dest, 0, new_pass=True)
    index.plan(["x"], ["x"], None, None)
    assert index.census() == (1, 1)  # what --dry-run counts and names
    assert (dest / "a" / "old").exists()
    index.close()


@pytest.mark.parametrize(("limit", "refused"), [
    ("3", False), ("2", True), ("75%", False), ("74.9%", True), ("0", True), ("100%", False),
])
def test_max_delete_refuses_a_pass_that_would_remove_more_removing_nothing(
        tmp_path: Path, limit: str, refused: bool) -> None:
    names = {f"f{i}": b"x" for i in range(4)}
    dest = dest_with(tmp_path, names, [])
    index = SyncIndex(dest, 0, new_pass=True)
    index.plan(["f0"], ["f0"], None, None)  # 3 of the 4 files are gone
    assert index.census() == (3, 4)
    if refused:
        with pytest.raises(UsageError, match=rf"would remove 3 of the 4 files in DEST \(75%\), "
                                             rf"more than --max-delete {limit} allows"):
            index.delete_gone(limit=DeleteLimit.parse(limit))
        assert sorted(p.name for p in dest.iterdir()) == [".bulkfetch", *sorted(names)]
    else:
        assert index.delete_gone(limit=DeleteLimit.parse(limit)) == 3
        assert sorted(p.name for p in dest.iterdir()) == [".bulkfetch", "f0"]
    index.close()


@pytest.mark.parametrize("text", ["-1", "x", "101%", "5%%", "", "1.5"])
def test_a_max_delete_that_means_nothing_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="give a number of files"):
        DeleteLimit.parse(text)


def test_max_delete_reads_counts_with_separators_and_shares() -> None:
    assert DeleteLimit.parse("1,000") == DeleteLimit(count=1000)
    assert DeleteLimit.parse(" 5% ") == DeleteLimit(percent=5.0)
    assert str(DeleteLimit.parse("12.5%")) == "12.5%" and str(DeleteLimit(count=7)) == "7"


def test_a_dest_named_through_a_symlink_is_walked(tmp_path: Path) -> None:
    """DEST given as a symlink to the directory (the user's choice of name): the walk
    found nothing there, and --delete removed nothing, silently."""
    real = dest_with(tmp_path, {"keep": b"k", "sub/old": b"o"}, [])
    link = tmp_path / "link"
    link.symlink_to(real)
    index = SyncIndex(link, 0, new_pass=True)
    index.plan(["keep"], ["keep"], None, None)
    assert [path for _, _, path in index.gone()] == ["sub/old"]
    assert index.census() == (1, 2)
    assert index.delete_gone() == 1
    assert sorted(p.name for p in real.iterdir()) == [".bulkfetch", "keep"]
    index.close()


def test_a_file_changed_in_dest_since_it_was_stored_is_fetched_whole(tmp_path: Path) -> None:
    """Its recorded MD5 is no longer its own: asked for with it, the server would answer
    304 and leave the edit in place. Modified after its sums line, it is fetched plain."""
    dest = dest_with(tmp_path, {"a": b"1", "b": b"22"}, [[("a", MD5_A), ("b", MD5_B)]])
    (dest / "b").write_bytes(b"edited")  # mtime now: after the sums line
    index = SyncIndex(dest, 0, new_pass=True)
    keep, headers = index.plan(["a", "b"], ["a", "b"], None, None)
    assert keep == [0, 1] and headers == (f'If-None-Match: "{MD5_A}"', "")
    # nor is a listing's equal size and MD5 taken for it
    keep, headers = index.plan(["a", "b"], ["a", "b"], [1, 2], [MD5_A, MD5_B])
    assert keep == [1] and headers == ("",) and index.changed_here == 2
    index.close()
