"""The contract every Source keeps (sources/base.py), checked for every implementation over
real servers on 127.0.0.1 and real files, in the style of rclone's fstests: one set of
tests, parametrised over the sources.

- Listing from token None until next_token is None yields every expected item, each once;
  a page's token lists the same page again (a journaled token is what a resumed run uses),
  in any order, in a new source.
- resolve() gives every listed item a safe name and a URL that a plain GET answers with the
  right bytes (the data set's formula says which); a worker's source (make_source with
  listing=False) resolves exactly as the lister's does.
- plain_urls() is None or exactly the resolved URLs, and only for plain names.
- A page's sizes / MD5s, when given, have one entry per item and are the bodies'; its total
  is the whole listing's; `plain` only when every item is plain.
- describe() is non-empty text and shows no credential.
- An unsafe name, carried the way the source naturally carries it, is refused (ValueError
  from resolve(), or the engine's check_name()) or resolves to a path inside DEST.
"""

from __future__ import annotations

import json
import os
import posixpath
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from contract_http import Getter
from contract_sources import (
    HostileCase,
    SourceCase,
    busiest_prefix,
    csv_case,
    fileserver_case,
    hostile_csv,
    hostile_fileserver,
    hostile_jsonapi,
    hostile_jsonl,
    hostile_oci,
    hostile_parquet,
    hostile_s3,
    hostile_urllist,
    index_case,
    jsonapi_case,
    jsonl_case,
    oci_case,
    parquet_case,
    s3_case,
    signer_of,
    tsv_case,
    urllist_case,
)

from bulkfetch.sources import tree
from bulkfetch.sources.abilities import KeyRange
from bulkfetch.sources.base import Source
from bulkfetch.sources.listed import ListedPage
from bulkfetch.util.names import RESERVED, check_name, is_plain

SOURCE_IDS = ("fileserver", "jsonapi", "s3", "s3-prefix", "urllist", "csv", "tsv-name-col",
              "jsonl-template-save-cols", "parquet-name-col-save-cols", "oci", "index")
HOSTILE_IDS = ("fileserver", "jsonapi", "s3", "urllist", "csv-name-col", "jsonl-name-col",
               "parquet-name-col", "oci")
MAX_PAGES = 200  # a listing longer than this is taken for a loop

@dataclass
class Listing:
    """A whole listing as a run's lister takes it: (token asked, page answered) in order."""

    source: Source
    pages: list[tuple[str | None, ListedPage]]

    @property
    def items(self) -> list[str]:
        return [item for _, page in self.pages for item in page.items]


def list_everything(source: Source) -> Listing:
    if source.abilities().tree is not None:
        return list_tree(source)
    pages: list[tuple[str | None, ListedPage]] = []
    token: str | None = None
    asked: set[str | None] = set()
    while True:
        assert token not in asked, f"the token {token!r} came back: the listing loops"
        asked.add(token)
        page = source.list_page(token)
        pages.append((token, page))
        if page.next_token is None:
            return Listing(source, pages)
        assert len(pages) < MAX_PAGES, "the listing does not end"
        token = page.next_token


def list_tree(source: Source) -> Listing:
    """A tree's pages (sources/tree.py), by the tokens each first page's next token names:
    the directory's other parts and its subdirectories."""
    pages: list[tuple[str | None, ListedPage]] = []
    waiting: list[str | None] = [None]
    asked: set[str | None] = set()
    while waiting:
        token = waiting.pop(0)
        assert token not in asked, f"the token {token!r} came back: the listing loops"
        asked.add(token)
        page = source.list_page(token)
        pages.append((token, page))
        assert page.next_token is not None, "a tree's page names what follows it"
        path, part = tree.parse_token(token)
        if part == 0:
            dirs, parts = tree.parse_next(page.next_token)
            waiting += [tree.token(path, later) for later in range(1, parts)]
            waiting += [tree.token(below, 0) for below in dirs]
        assert len(pages) < MAX_PAGES, "the listing does not end"
    return Listing(source, pages)


@pytest.fixture(scope="module", params=SOURCE_IDS)
def source_case(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> SourceCase:
    kind: str = request.param
    if kind == "oci":
        return oci_case(request.getfixturevalue("oci_image"))
    if kind == "index":
        return index_case(request.getfixturevalue("index_server").url,
                          tmp_path_factory.mktemp("source-index") / "dest")
    url: str = request.getfixturevalue("data_server").url
    work = tmp_path_factory.mktemp(f"source-{kind}")
    dest = work / "dest"
    if kind == "fileserver":
        return fileserver_case(url, dest)
    if kind == "jsonapi":
        return jsonapi_case(url, dest)
    if kind in ("s3", "s3-prefix"):
        return s3_case(url, dest, work, prefix=busiest_prefix() if kind == "s3-prefix" else "")
    builders = {"urllist": urllist_case, "csv": csv_case, "tsv-name-col": tsv_case,
                "jsonl-template-save-cols": jsonl_case,
                "parquet-name-col-save-cols": parquet_case}
    return builders[kind](url, work, dest)


@pytest.fixture(scope="module")
def listing(source_case: SourceCase) -> Listing:
    return list_everything(source_case.make())


# -- listing --------------------------------------------------------------------------------
def test_listing_from_the_first_page_to_the_last_yields_every_item_once(
        source_case: SourceCase, listing: Listing) -> None:
    items = listing.items
    twice = [item for item, count in Counter(items).items() if count > 1]
    assert not twice, f"listed more than once: {twice[:5]}"
    names = [listing.source.resolve(item)[0] for item in items]
    missing = sorted(set(source_case.expected) - set(names))
    extra = sorted(set(names) - set(source_case.expected))
    assert not missing and not extra, (f"{len(missing)} missing, e.g. {missing[:3]}; "
                                       f"{len(extra)} unexpected, e.g. {extra[:3]}")
    assert len(names) == len(set(names)), "two items resolve to one name"
    # the data set spans pages: the test really walked tokens
    assert len(listing.pages) >= source_case.min_pages


def test_a_token_lists_the_same_page_again_in_any_order_and_in_a_new_source(
        source_case: SourceCase, listing: Listing) -> None:
    # The same source, last page first: a page depends on its token alone, not on what
    # this source listed before.
    for token, page in reversed(listing.pages):
        assert listing.source.list_page(token) == page, f"token {token!r}"
    # A new source, as a resumed run builds it, given the tokens its journal holds.
    resumed = source_case.make()
    for token, page in listing.pages[1:] + listing.pages[:1]:
        assert resumed.list_page(token) == page, f"token {token!r} in a new source"


# -- resolving ------------------------------------------------------------------------------
def test_every_item_resolves_to_a_safe_name_and_a_url_serving_its_bytes(
        source_case: SourceCase, listing: Listing, getter: Getter) -> None:
    signer = signer_of(listing.source)
    wrong: list[str] = []
    for item in listing.items:
        name, url = listing.source.resolve(item)
        assert check_name(name) is None, f"{item!r} resolves to an unsafe name {name!r}"
        expected = source_case.expected[name]
        fetched = getter.get(url, signer)
        if expected.json is not None:
            if json.loads(fetched.body) != expected.json:
                wrong.append(f"{name}: {fetched.body[:80]!r} is not {expected.json!r}")
        elif (fetched.size, fetched.md5) != (expected.size, expected.md5):
            wrong.append(f"{name}: {url} served {fetched.size} bytes, MD5 {fetched.md5}, "
                         f"not {expected.size} bytes, MD5 {expected.md5}")
    assert not wrong, f"{len(wrong)} wrong bodies, e.g. {wrong[:3]}"


def test_a_workers_source_resolves_every_item_as_the_listers_does(
        source_case: SourceCase, listing: Listing) -> None:
    # Workers build their own source (make_source(options, listing=False)) and resolve the
    # items the lister journaled: any difference stores a file under another name.
    worker = source_case.make(listing=False)
    for _, page in listing.pages:
        lister_urls = listing.source.plain_urls(page.items)
        worker_urls = worker.plain_urls(page.items)
        assert (None if lister_urls is None else list(lister_urls)) == \
            (None if worker_urls is None else list(worker_urls))
        for item in page.items:
            assert worker.resolve(item) == listing.source.resolve(item), item


def test_plain_urls_is_none_or_exactly_the_resolved_urls_of_plain_names(
        source_case: SourceCase, listing: Listing) -> None:
    source = listing.source
    for _, page in listing.pages:
        # a whole page, and some of its items (a --retry-failed page holds only the failed)
        for items in (page.items, page.items[1::3]):
            urls = source.plain_urls(items)
            if urls is None:
                continue
            resolved = [source.resolve(item) for item in items]
            assert list(urls) == [url for _, url in resolved]
            assert all(is_plain(item) for item in items), "plain URLs for non-plain names"
            assert [name for name, _ in resolved] == list(items), "a plain item is its name"


def test_page_sizes_total_and_plain_flag_agree_with_the_items(
        source_case: SourceCase, listing: Listing) -> None:
    source, every = listing.source, len(listing.items)
    for token, page in listing.pages:
        names = [source.resolve(item)[0] for item in page.items]
        if page.sizes is not None:
            assert len(page.sizes) == len(page.items), f"token {token!r}: sizes"
            for name, size in zip(names, page.sizes, strict=True):
                # -1: not listed; else what a GET of it brings
                assert size in (-1, source_case.expected[name].size), (name, size)
        if page.total is not None:
            assert page.total == every, f"token {token!r}: total {page.total} of {every}"
        assert isinstance(page.plain, bool), f"token {token!r}: plain is {page.plain!r:.80}"
        if page.plain:
            assert all(is_plain(item) for item in page.items), f"token {token!r}: plain"


def test_page_md5s_when_listed_are_one_per_item_and_the_bodies(
        source_case: SourceCase, listing: Listing) -> None:
    source = listing.source
    for token, page in listing.pages:
        md5s = getattr(page, "md5s", None)  # the items' MD5s ("": unknown), when listed
        if md5s is None:
            continue
        assert isinstance(md5s, tuple) and len(md5s) == len(page.items), \
            f"token {token!r}: md5s is {md5s!r:.80}"
        for item, md5 in zip(page.items, md5s, strict=True):
            name = source.resolve(item)[0]
            assert md5 in ("", source_case.expected[name].md5), (name, md5)


def test_key_ranges_list_what_pages_list_with_the_same_page_contract(
        source_case: SourceCase, listing: Listing) -> None:
    """S3's other listing interface (listing/range_lister.py lists key ranges at once): the
    ranges cover the keys exactly, split anywhere, each page keeping the page contract."""
    source = listing.source.abilities().ranges
    if source is None:
        pytest.skip("the source lists page by page (Abilities.ranges is None)")

    def walk(span: KeyRange) -> tuple[list[str], list[str]]:
        items: list[str] = []
        keys: list[str] = []
        while True:
            page = source.list_range(span)
            assert all(span.holds(key) for key in page.keys), f"keys outside {span}"
            assert list(page.keys) == sorted(page.keys)
            if page.sizes is not None:
                assert len(page.sizes) == len(page.items)
            if page.md5s is not None:
                assert isinstance(page.md5s, tuple) and len(page.md5s) == len(page.items), \
                    f"md5s is {page.md5s!r:.80}"
            assert isinstance(page.plain, bool), f"plain is {page.plain!r:.80}"
            if page.plain:
                assert all(is_plain(item) for item in page.items)
            items += page.items
            keys += page.keys
            if not page.more:
                return items, keys
            span = KeyRange(page.keys[-1], span.upto)

    items, keys = walk(KeyRange(None, None))
    assert items == listing.items
    middle = keys[len(keys) // 2]
    first, first_keys = walk(KeyRange(None, middle))
    rest, _ = walk(KeyRange(middle, None))
    assert first_keys[-1] == middle
    assert first + rest == listing.items


def test_describe_names_the_source_and_shows_no_secret(source_case: SourceCase,
                                                       listing: Listing) -> None:
    for source in (listing.source, source_case.make(listing=False)):
        text = source.describe()
        assert isinstance(text, str) and text.strip()
        for secret in source_case.secrets:
            assert secret not in text, f"describe() shows a secret: {text!r}"


# -- hostile names ---------------------------------------------------------------------------
@pytest.fixture(scope="module", params=HOSTILE_IDS)
def hostile_case(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> HostileCase:
    kind: str = request.param
    if kind == "oci":
        return hostile_oci(request.getfixturevalue("oci_image"))
    url: str = request.getfixturevalue("hostile_server").url
    work = tmp_path_factory.mktemp(f"hostile-{kind}")
    dest = work / "dest"
    if kind == "fileserver":
        return hostile_fileserver(url, dest)
    if kind == "jsonapi":
        return hostile_jsonapi(url, dest)
    if kind == "s3":
        return hostile_s3(url, dest, work)
    builders = {"urllist": hostile_urllist, "csv-name-col": hostile_csv,
                "jsonl-name-col": hostile_jsonl, "parquet-name-col": hostile_parquet}
    return builders[kind](url, work, dest)


@pytest.fixture(scope="module")
def hostile_listing(hostile_case: HostileCase) -> Listing:
    return list_everything(hostile_case.make())


def escapes(dest: Path, name: str) -> str | None:
    """Why storing `name` as DEST/<name> would leave DEST or touch bulkfetch's state, found
    without names.check_name (which this suite checks the sources through)."""
    if "\0" in name or "\\" in name:
        return "NUL or backslash"
    parts = name.split("/")
    if any(unicodedata.normalize("NFKC", part) in ("", ".", "..") for part in parts):
        return "an empty, '.' or '..' component (or one that normalises to it)"
    if parts[0] == RESERVED:
        return f"inside {RESERVED}"
    joined = posixpath.normpath(posixpath.join(str(dest), name))
    if not joined.startswith(str(dest) + os.sep):
        return f"resolves to {joined}"
    return None


def test_an_unsafe_item_is_refused_or_resolves_inside_dest(
        hostile_case: HostileCase, hostile_listing: Listing, getter: Getter,
        tmp_path: Path) -> None:
    source = hostile_listing.source
    dest = tmp_path / "dest"
    signer = signer_of(source)
    refused = fetched = 0
    for item in [*hostile_listing.items, *hostile_case.unlisted]:
        try:
            name, url = source.resolve(item)
        except ValueError as exc:
            assert str(exc).strip(), f"{item!r} refused without a reason"
            refused += 1
            continue
        if check_name(name) is not None:  # the engine refuses it before any transfer
            refused += 1
            continue
        why = escapes(dest, name)
        assert why is None, f"{item!r} resolves to {name!r}, which check_name lets by: {why}"
        body = hostile_case.bodies.get(name)
        if body is not None:  # its URL must still be the one that serves this name
            assert getter.get(url, signer).body == body, f"{item!r}: {url}"
            fetched += 1
    # the attack reached the source at all (else this test would prove nothing)
    assert refused >= hostile_case.min_refused, f"only {refused} items refused"
    assert fetched or not hostile_case.bodies, "no safe name's body was checked"


def test_an_item_with_a_safe_name_resolves_to_a_url_libcurl_can_take(
        hostile_case: HostileCase, hostile_listing: Listing) -> None:
    # pycurl refuses a URL holding NUL with ValueError: not a failure of that one file but
    # an exception out of the fetcher's loop. resolve() must refuse such an item instead.
    source = hostile_listing.source
    sent: list[tuple[str, str]] = []
    for item in hostile_listing.items:
        try:
            name, url = source.resolve(item)
        except ValueError:
            continue
        if check_name(name) is None:
            sent.append((name, url))
    assert sent, "no item of the hostile listing would be fetched: nothing checked"
    with_nul = [(name, url) for name, url in sent if "\0" in url]
    assert not with_nul, f"URLs holding NUL: {with_nul[:3]!r}"


def test_plain_urls_never_vouches_for_an_unsafe_name(hostile_listing: Listing) -> None:
    # The fetcher skips check_name for a page plain_urls() answers: a URL for an unsafe
    # name there would store it unchecked.
    source = hostile_listing.source
    for _, page in hostile_listing.pages:
        for items in (page.items, *((item,) for item in page.items)):
            urls = source.plain_urls(items)
            if urls is not None:
                unsafe = [item for item in items if check_name(item) is not None]
                assert not unsafe, f"plain URLs for unsafe names {unsafe[:3]!r}"
                assert list(urls) == [source.resolve(item)[1] for item in items]
