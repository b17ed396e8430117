"""Serving a real directory: sorted depth-first pages, and nothing outside the root."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from bulkfetch.server.tree import FileTree

FILES = [
    "a-c",  # '-' sorts before '/', so a plain sort of full paths would put it before a/...
    "a/b",
    "a/c/d",
    "a/c/e",
    "a/c/f/g",
    "a/z",
    "a0",
    "b",
    "c/empty-sibling",
    "d/e/f/g/h/deep",
    "m/1",
    "m/10",
    "m/2",
    "z.txt",
    "é/ünï",
]


def build(root: Path, files: list[str] = FILES) -> None:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"body of {name}\n".encode())
    (root / "empty-dir").mkdir()
    (root / "d" / "empty-inside").mkdir()


def independent_walk(directory: Path, prefix: str = "") -> list[str]:
    """Depth-first, each directory's entries sorted by name, symlinks not followed."""
    out = []
    for entry in sorted(os.listdir(directory)):
        path = directory / entry
        name = prefix + entry
        if path.is_symlink():
            continue
        if path.is_dir():
            out.extend(independent_walk(path, name + "/"))
        elif path.is_file():
            out.append(name)
    return out


def all_pages(tree: FileTree) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        names, cursor = tree.page(cursor)
        pages.append(names)
        if cursor is None:
            return pages
        assert len(pages) < 10_000, "listing does not end"


@pytest.mark.parametrize("page_size", [1, 2, 3, 4, 7, 15, 16, 100])
def test_pages_follow_a_sorted_depth_first_walk(tmp_path: Path, page_size: int) -> None:
    build(tmp_path)
    expected = independent_walk(tmp_path)
    assert sorted(expected) == sorted(FILES)
    assert expected.index("a/z") < expected.index("a-c")  # depth-first, not a plain sort
    pages = all_pages(FileTree(str(tmp_path), page_size))
    assert [n for page in pages for n in page] == expected
    assert all(len(page) == page_size for page in pages[:-1])
    assert 0 < len(pages[-1]) <= page_size
    assert len(pages) == -(-len(expected) // page_size)


def test_cursor_is_the_last_name_and_resumes_in_a_new_instance(tmp_path: Path) -> None:
    build(tmp_path)
    first, cursor = FileTree(str(tmp_path), 3).page(None)
    assert cursor == first[-1].encode()
    second, _ = FileTree(str(tmp_path), 3).page(cursor)
    expected = independent_walk(tmp_path)
    assert first + second == expected[:6]


def test_empty_root_gives_one_empty_page(tmp_path: Path) -> None:
    assert FileTree(str(tmp_path), 2).page(None) == ([], None)
    (tmp_path / "only-dirs" / "x").mkdir(parents=True)
    assert FileTree(str(tmp_path), 2).page(None) == ([], None)


def test_root_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        FileTree(str(tmp_path / "file"), 2)
    with pytest.raises(NotADirectoryError):
        FileTree(str(tmp_path / "missing"), 2)


def test_lookup_reads_files(tmp_path: Path) -> None:
    build(tmp_path)
    tree = FileTree(str(tmp_path), 2)
    for name in FILES:
        entry = tree.lookup(name)
        assert entry is not None, name
        content = f"body of {name}\n".encode()
        assert entry.size == len(content)
        assert b"".join(entry.read(0, entry.size)) == content
        assert b"".join(entry.read(3, 7)) == content[3:7]
        assert entry.last_modified == int(os.stat(tmp_path / name).st_mtime)
    assert tree.lookup("b").etag() == '"' + hashlib.md5(b"body of b\n").hexdigest() + '"'


@pytest.mark.parametrize(
    "name",
    ["", "..", "../outside", "a/../b", "a/../../outside", "./b", "a/./b", "/b", "/etc/passwd",
     "a//b", "a/", "b/", "b\x00", "a/b\x00x", "a", "empty-dir", "missing", "a/c"],
)
def test_lookup_refuses(tmp_path: Path, name: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    build(root)
    (tmp_path / "outside").write_text("secret")
    assert FileTree(str(root), 2).lookup(name) is None


def test_symlinks_leading_outside_are_neither_listed_nor_served(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    build(root)
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret").write_text("secret")
    (outside / "sub" / "more").write_text("more")
    (root / "to-file").symlink_to(outside / "secret")
    (root / "to-dir").symlink_to(outside)
    (root / "a" / "up").symlink_to("../..")  # relative, climbs out of the root
    (root / "to-root-parent").symlink_to(tmp_path)
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    tree = FileTree(str(root), 2)
    listed = [n for page in all_pages(tree) for n in page]
    assert listed == independent_walk(root)
    assert not any("secret" in n or "more" in n or n.startswith("to-") for n in listed)
    for name in ("to-file", "to-dir/secret", "to-dir/sub/more", "a/up/outside/secret",
                 "to-root-parent/outside/secret", "dangling"):
        assert tree.lookup(name) is None, name
    # a path that leaves and comes back resolves inside the root: that file may be served
    assert tree.lookup("to-root-parent/root/b").path == str((root / "b").resolve())


def test_symlinked_root_is_resolved(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    build(real)
    (tmp_path / "alias").symlink_to(real)
    tree = FileTree(str(tmp_path / "alias"), 4)
    assert [n for p in all_pages(tree) for n in p] == independent_walk(real)
    assert tree.lookup("a/b") is not None


def test_symlinks_staying_inside_are_followed(tmp_path: Path) -> None:
    build(tmp_path)
    (tmp_path / "link-to-b").symlink_to("b")
    (tmp_path / "m" / "link-to-dir").symlink_to("../a/c")
    tree = FileTree(str(tmp_path), 2)
    listed = [n for page in all_pages(tree) for n in page]
    assert "link-to-b" in listed
    for inner in ("d", "e", "f/g"):
        assert f"m/link-to-dir/{inner}" in listed
    expected = independent_walk(tmp_path)
    assert [n for n in listed if "link" not in n] == expected
    entry = tree.lookup("m/link-to-dir/f/g")
    assert entry is not None
    assert b"".join(entry.read(0, entry.size)) == b"body of a/c/f/g\n"
    assert tree.lookup("link-to-b") is not None


def run_with_timeout(function, seconds: float = 10.0):  # type: ignore[no-untyped-def]
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(function()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "hung"
    return result[0]


def test_symlink_loops_do_not_hang(tmp_path: Path) -> None:
    build(tmp_path)
    (tmp_path / "a" / "c" / "loop-to-a").symlink_to("..")  # a/c/loop-to-a -> a
    (tmp_path / "loop-to-root").symlink_to(".")
    (tmp_path / "self").symlink_to("self")
    (tmp_path / "ping").symlink_to("pong")
    (tmp_path / "pong").symlink_to("ping")
    for page_size in (1, 2, 3, 1000):
        tree = FileTree(str(tmp_path), page_size)
        pages = run_with_timeout(lambda tree=tree: all_pages(tree))
        listed = [n for page in pages for n in page]  # type: ignore[attr-defined]
        assert listed == independent_walk(tmp_path)
    tree = FileTree(str(tmp_path), 2)
    assert tree.lookup("self") is None
    assert tree.lookup("ping") is None
    assert tree.lookup("loop-to-root/b") is not None  # inside the root, so served


def test_names_that_are_not_utf8_do_not_break_pagination(tmp_path: Path) -> None:
    root = os.fsencode(tmp_path)
    try:
        (Path(os.fsdecode(root + b"/d"))).mkdir()
        with open(root + b"/d/\xff.bin", "wb") as handle:
            handle.write(b"x")
    except OSError:
        pytest.skip("the file system refuses names that are not UTF-8")
    (tmp_path / "d" / "a").write_text("a")
    (tmp_path / "e").write_text("e")
    tree = FileTree(str(tmp_path), 1)
    listed = [n for page in all_pages(tree) for n in page]
    assert listed == ["d/a", "d/\udcff.bin", "e"]


def test_changes_between_pages_are_seen(tmp_path: Path) -> None:
    build(tmp_path)
    tree = FileTree(str(tmp_path), 3)
    first, cursor = tree.page(None)
    (tmp_path / "y-new").write_text("new")
    rest = [n for page in all_pages_from(tree, cursor) for n in page]
    assert "y-new" in rest
    assert first + rest == independent_walk(tmp_path)


def all_pages_from(tree: FileTree, cursor: bytes | None) -> list[list[str]]:
    pages = []
    while cursor is not None:
        names, cursor = tree.page(cursor)
        pages.append(names)
    return pages
