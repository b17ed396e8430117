"""sync.py's index on a real directory: MD5s from the sums (a later line wins), what a page
asks for (nothing for a file the listing shows unchanged, If-None-Match for a kept one,
plain for a missing one or a symlink), and what --delete finds gone and removes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bulkfetch.hashfile import sum_lines
from bulkfetch.names import local_parts
from bulkfetch.sync import SyncIndex

MD5_A, MD5_B, MD5_C = "a" * 32, "b" * 32, "c" * 32


def dest_with(tmp_path: Path, files: dict[str, bytes], sums: list[list[tuple[str, str]]],
              fanout: int = 0) -> Path:
    dest = tmp_path / "dest"
    (dest / ".bulkfetch" / "sums").mkdir(parents=True)
    for name, body in files.items():
        path = dest.joinpath(*local_parts(name, fanout))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
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
    assert index.delete_gone(dry_run=True, each=shown.append) == 3
    assert sorted(shown) == gone and all((dest / path).is_symlink() or (dest / path).exists()
                                         for path in gone)
    assert index.delete_gone(dry_run=False) == 3
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
    assert index.delete_gone(dry_run=False) == 1
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
