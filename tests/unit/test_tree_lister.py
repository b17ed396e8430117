"""A tree of directories listed at once (listing/tree_lister.py) and the pages and tokens a
directory becomes (sources/tree.py), over a fake tree whose directory requests libcurl
really makes (file:// URLs to a directory of JSON pages), so the multi, the retries and the
resume plan run as in a crawl."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pycurl
import pytest

from bulkfetch.config import RetryPolicy
from bulkfetch.listing.lister import Listed, ListingFailed, ListingFinished
from bulkfetch.listing.tree_lister import TreeLister, resume_plan
from bulkfetch.sources.listed import ListingError
from bulkfetch.sources.tree import (
    LATER_PART,
    PAGE_FILES,
    DirPage,
    next_token,
    pages_of,
    parse_next,
    parse_token,
    parts_of,
    token,
)

FAST = RetryPolicy(retries=3, backoff_base_s=0.01, backoff_cap_s=0.02)


class FakeTree:
    """A TreeSource over `tree` (directory path -> (files, subdirectory names)), each
    directory a JSON file under `root` fetched by libcurl. `faults` maps a path to the
    errors its first answers raise."""

    def __init__(self, root: Path, tree: dict[str, tuple[list[str], list[str]]],
                 faults: dict[str, list[ListingError]] | None = None,
                 depth_limit: int | None = None) -> None:
        self.root = root
        self.faults = faults or {}
        self.asked: list[str] = []
        self.depth_limit = depth_limit
        for number, (path, (files, dirs)) in enumerate(tree.items()):
            (root / f"{number}.json").write_text(json.dumps([path, files, dirs]))
        self.numbers = {path: number for number, path in enumerate(tree)}

    def list_handle(self) -> pycurl.Curl:
        return pycurl.Curl()

    def dir_url(self, path: str) -> str:
        return (self.root / f"{self.numbers.get(path, 'missing')}.json").as_uri()

    def dir_page(self, path: str, status: int, headers: list[bytes], body: bytes,
                 url: str) -> DirPage:
        self.asked.append(path)
        waiting = self.faults.get(path)
        if waiting:
            raise waiting.pop(0)
        listed, files, dirs = json.loads(body)
        assert listed == path
        return DirPage(tuple(path + name for name in files), (len(path),) * len(files),
                       tuple(path + name + "/" for name in dirs),
                       sums=tuple(path + name for name in files if name.endswith("SUMS")))

    def file_url(self, item: str) -> str:
        return (self.root / item.replace("/", "_")).as_uri()

    def read_sums(self, item: str, status: int, body: bytes) -> dict[str, str]:
        return json.loads(body)

    def transfer_error(self, code: int, message: str, url: str) -> ListingError:
        return ListingError(f"{url}: {message}", retryable=False)

    def max_depth(self) -> int | None:
        return self.depth_limit


def wide_tree(levels: int = 3, fanout: int = 3, files: int = 2) -> dict[str, tuple[
        list[str], list[str]]]:
    """Every directory `fanout` subdirectories deep to `levels`, each with `files` files."""
    tree: dict[str, tuple[list[str], list[str]]] = {}

    def add(path: str, level: int) -> None:
        subdirs = [f"d{i}" for i in range(fanout)] if level < levels else []
        tree[path] = ([f"f{i}.txt" for i in range(files)], subdirs)
        for name in subdirs:
            add(path + name + "/", level + 1)

    add("", 0)
    return tree


def drain(lister: TreeLister, timeout: float = 20.0) -> tuple[list[Listed], object]:
    """Every page the lister sends, and how it ended."""
    lister.start()
    pages: list[Listed] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = lister.out.get(timeout=timeout)
        if isinstance(event, Listed):
            pages.append(event)
            continue
        lister.stop()
        lister.join(5)
        return pages, event
    raise AssertionError("the lister did not end")


def every_file(tree: dict[str, tuple[list[str], list[str]]]) -> set[str]:
    return {path + name for path, (files, _) in tree.items() for name in files}


# -- tokens and pages ---------------------------------------------------------------------
@pytest.mark.parametrize("path", ["", "a/", "a b/100%/é/", "bad\udcff/", "q\"uote/"])
def test_a_token_names_its_directory_and_part_and_is_ascii(path: str) -> None:
    text = token(path, 3)
    assert text.isascii()
    assert parse_token(text) == (path, 3)
    assert parse_token(None) == ("", 0)


@pytest.mark.parametrize("text", ["a/", "tree:[1, 0]", "tree:[\"a/\", -1]"])
def test_what_is_not_a_tree_token_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a directory tree's token"):
        parse_token(text)


def test_a_large_directory_is_cut_into_pages_and_a_sample_is_never_cut() -> None:
    files = [f"s{i // 3:05d}.{('jpg', 'txt', 'json')[i % 3]}" for i in range(PAGE_FILES * 2)]
    plain = parts_of(files)
    assert plain == [(0, PAGE_FILES), (PAGE_FILES, 2 * PAGE_FILES)]
    kept = parts_of(files, key_of=lambda name: name.rpartition(".")[0])
    assert [end for _, end in kept][:1] == [PAGE_FILES + 2]  # the sample's last two kept
    assert kept[-1][1] == len(files) and len(kept) == 2
    assert parts_of([]) == [(0, 0)]  # an empty directory is one empty page


def test_the_first_page_names_the_subdirectories_and_the_parts() -> None:
    page = DirPage(tuple(f"a/f{i}" for i in range(PAGE_FILES + 5)), (-1,) * (PAGE_FILES + 5),
                   ("a/b/", "a/c/"))
    (first_token, first), (second_token, second) = pages_of("a/", page)
    assert parse_next(first.next_token) == (("a/b/", "a/c/"), 2)
    assert second.next_token == LATER_PART and parse_next(second.next_token) == ((), 0)
    assert (parse_token(first_token), parse_token(second_token)) == (("a/", 0), ("a/", 1))
    assert first.sizes is None  # no size known: none sent
    assert len(first.items) + len(second.items) == PAGE_FILES + 5


# -- listing --------------------------------------------------------------------------------
def test_the_whole_tree_is_listed_each_directory_once(tmp_path: Path) -> None:
    tree = wide_tree()
    source = FakeTree(tmp_path, tree)
    pages, end = drain(TreeLister(source, FAST, [], [], 0, True, ahead=4, concurrency=4))
    assert isinstance(end, ListingFinished)
    assert sorted(source.asked) == sorted(tree)
    assert [page.seq for page in pages] == list(range(len(tree)))
    assert {item for page in pages for item in page.page.items} == every_file(tree)
    assert all(page.page.sizes == (len(parse_token(page.token)[0]),) * 2 for page in pages)


def test_a_rerun_lists_only_what_the_journal_does_not_hold(tmp_path: Path) -> None:
    tree = wide_tree()
    first = FakeTree(tmp_path, tree)
    pages, _ = drain(TreeLister(first, FAST, [], [], 0, True, ahead=64, concurrency=2))
    kept = pages[:len(pages) // 2]  # journaled before the run stopped
    journaled = [(page.token, page.page.next_token) for page in kept]
    assert all(page.token is not None for page in kept)
    waiting, unfinished = resume_plan(journaled)  # type: ignore[arg-type]
    assert not unfinished
    listed = {parse_token(page.token)[0] for page in kept}
    found = {below for page in kept for below in parse_next(page.page.next_token)[0]}
    assert sorted(waiting) == sorted(found - listed)
    # the last journaled page was not done: listed again from its own directory
    replay = [(kept[-1].seq, kept[-1].token, kept[-1].page.next_token)]
    second = FakeTree(tmp_path, tree)
    again, end = drain(TreeLister(second, FAST, replay, journaled,  # type: ignore[arg-type]
                                  len(kept), True, ahead=64, concurrency=3))
    assert isinstance(end, ListingFinished)
    replayed_dir = parse_token(kept[-1].token)[0]
    assert sorted(second.asked) == sorted((set(tree) - listed) | {replayed_dir})
    fresh = [page for page in again if not page.replay]
    assert [page.seq for page in fresh] == list(range(len(kept), len(tree)))
    assert [page.page for page in again if page.replay] == [kept[-1].page]
    assert {item for page in kept + fresh for item in page.page.items} == every_file(tree)


def test_a_directory_whose_later_parts_were_never_journaled_sends_only_those(
        tmp_path: Path) -> None:
    tree = {"": ([f"f{i:05d}" for i in range(PAGE_FILES * 2 + 10)], [])}
    source = FakeTree(tmp_path, tree)
    pages, _ = drain(TreeLister(source, FAST, [], [], 0, True, ahead=8, concurrency=1))
    assert len(pages) == 3
    journaled = [(pages[0].token, pages[0].page.next_token)]
    assert resume_plan(journaled) == ([], {"": 1})  # type: ignore[arg-type]
    again, end = drain(TreeLister(FakeTree(tmp_path, tree), FAST, [], journaled,  # type: ignore[arg-type]
                                  1, True, ahead=8, concurrency=1))
    assert isinstance(end, ListingFinished)
    assert [(page.seq, page.token, page.page) for page in again] == \
        [(1, pages[1].token, pages[1].page), (2, pages[2].token, pages[2].page)]


def test_a_gone_subdirectory_is_one_failure_and_the_crawl_goes_on(tmp_path: Path) -> None:
    tree = wide_tree(levels=2, fanout=2)
    gone = ListingError("listing d1/: HTTP 404: no directory there", retryable=False)
    source = FakeTree(tmp_path, tree, faults={"d1/": [gone]})
    pages, end = drain(TreeLister(source, FAST, [], [], 0, True, ahead=64, concurrency=2))
    assert isinstance(end, ListingFinished)
    refused = [page for page in pages if parse_token(page.token)[0] == "d1/"]
    assert [page.page.items for page in refused] == [("d1/\0\0" + str(gone),)]
    assert parse_next(refused[0].page.next_token) == ((), 1)  # nothing below it listed
    assert not any(path.startswith("d1/") and path != "d1/" for path in source.asked)
    assert {item for page in pages for item in page.page.items if "\0" not in item} == {
        name for name in every_file(tree) if not name.startswith("d1/")}


def test_a_passing_fault_is_retried_and_the_top_refused_ends_the_run(tmp_path: Path) -> None:
    tree = wide_tree(levels=1, fanout=2)
    busy = ListingError("listing d0/: HTTP 503", retryable=True)
    source = FakeTree(tmp_path, tree, faults={"d0/": [busy, busy]})
    pages, end = drain(TreeLister(source, FAST, [], [], 0, True, ahead=64, concurrency=2))
    assert isinstance(end, ListingFinished)
    assert source.asked.count("d0/") == 3
    assert {item for page in pages for item in page.page.items} == every_file(tree)

    forbidden = ListingError("listing /: 403", retryable=False, usage=True)
    top = FakeTree(tmp_path, tree, faults={"": [forbidden]})
    pages, end = drain(TreeLister(top, FAST, [], [], 0, True, ahead=64, concurrency=2))
    assert pages == [] and isinstance(end, ListingFailed) and end.usage


def test_retries_that_run_out_end_the_listing_to_be_resumed(tmp_path: Path) -> None:
    tree = wide_tree(levels=1, fanout=1)
    busy = ListingError("listing d0/: HTTP 503", retryable=True)
    source = FakeTree(tmp_path, tree, faults={"d0/": [busy] * 10})
    _, end = drain(TreeLister(source, FAST, [], [], 0, True, ahead=64, concurrency=2))
    assert isinstance(end, ListingFailed) and not end.usage
    assert "after 4 attempts" in end.message


def test_what_waits_to_be_listed_stays_small_in_a_wide_deep_tree(tmp_path: Path) -> None:
    tree = wide_tree(levels=5, fanout=4, files=0)  # 1,365 directories
    source = FakeTree(tmp_path, tree)
    lister = TreeLister(source, FAST, [], [], 0, True, ahead=4096, concurrency=4)
    most = 0
    original = lister._take

    def watched(*args: object) -> bool:
        nonlocal most
        most = max(most, len(lister.stack))
        return original(*args)  # type: ignore[arg-type]

    lister._take = watched  # type: ignore[method-assign]
    pages, end = drain(lister)
    assert isinstance(end, ListingFinished) and len(pages) == len(tree)
    # depth first: at most levels x fan-out for each directory in flight, not a level's
    # width (1,024 at the last)
    assert most <= 5 * 4 * 4, most


def test_next_token_round_trips_the_subdirectories() -> None:
    dirs = ("a/", "b c/", "é/", "\udcff/")
    assert parse_next(next_token(dirs, 3)) == (dirs, 3)


def test_a_directorys_pages_wait_for_its_checksum_files_and_carry_their_digests(
        tmp_path: Path) -> None:
    tree = {"": (["MD5SUMS", "a", "b"], ["d"]), "d/": (["SHA256SUMS", "c"], []),
            "e/": ([], [])}
    tree[""][1].append("e")
    tree["e/"] = (["BROKEN_SUMS", "f"], [])
    (tmp_path / "MD5SUMS").write_text(json.dumps({"a": "0" * 32}))
    (tmp_path / "d_SHA256SUMS").write_text(json.dumps({"d/c": "sha256:" + "1" * 64}))
    # e/BROKEN_SUMS is never written: its request fails, and e/'s files go unchecked
    source = FakeTree(tmp_path, tree)
    pages, end = drain(TreeLister(source, FAST, [], [], 0, True, ahead=64, concurrency=2))
    assert isinstance(end, ListingFinished)
    by_dir = {parse_token(page.token)[0]: page.page for page in pages}
    assert by_dir[""].md5s == ("", "0" * 32, "")
    assert by_dir[""].sizes == (0, 0, 0)  # sent with the digests, so the engine reads them
    assert by_dir["d/"].md5s == ("", "sha256:" + "1" * 64)
    assert by_dir["e/"].md5s is None and by_dir["e/"].items == ("e/BROKEN_SUMS", "e/f")


def test_a_checksum_file_checks_the_files_below_it_and_sha256_wins_over_md5(
        tmp_path: Path) -> None:
    tree = {"": (["SHA256SUMS", "MD5SUMS"], ["d", "e"]), "d/": (["c", "k"], ["deep"]),
            "d/deep/": (["x"], []), "e/": (["MD5SUMS", "f"], [])}
    (tmp_path / "SHA256SUMS").write_text(json.dumps(
        {"d/c": "sha256:" + "1" * 64, "d/deep/x": "sha256:" + "2" * 64}))
    (tmp_path / "MD5SUMS").write_text(json.dumps({"d/c": "a" * 32, "d/k": "b" * 32,
                                                  "e/f": "c" * 32}))
    (tmp_path / "e_MD5SUMS").write_text(json.dumps({"e/f": "d" * 32}))  # nearer: it wins
    source = FakeTree(tmp_path, tree)
    pages, end = drain(TreeLister(source, FAST, [], [], 0, True, ahead=64, concurrency=2))
    assert isinstance(end, ListingFinished)
    by_dir = {parse_token(page.token)[0]: page.page for page in pages}
    assert by_dir["d/"].md5s == ("sha256:" + "1" * 64, "b" * 32)
    assert by_dir["d/deep/"].md5s == ("sha256:" + "2" * 64,)
    assert by_dir["e/"].md5s == ("", "d" * 32)
