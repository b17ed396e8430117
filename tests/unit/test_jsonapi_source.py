"""The generic JSON listing source (sources/jsonapi.py) on pages of each preset's shape,
presets as data (sources/apis.py), the fingerprint, and what the engine does with the
digests such a listing states (stated.unlike_listing, the lister's metadata)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from bulkfetch.api import build_options
from bulkfetch.config import ApiShape, SourceShape
from bulkfetch.engine.stated import unlike_listing
from bulkfetch.errors import UsageError
from bulkfetch.listing.lister import _cut, _joined
from bulkfetch.sources import make_source
from bulkfetch.sources.apis import PRESETS, load_preset, resolve_shape
from bulkfetch.sources.fileserver import FileServerSource
from bulkfetch.sources.jsonapi import JsonApiSource
from bulkfetch.sources.listed import ListedPage
from bulkfetch.sources.pagination import PageError


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def source(url: str, api: str | None = None, **given: object) -> JsonApiSource:
    shape, api_shape = resolve_shape(api, None, given, generic=True)
    assert api_shape is not None
    return JsonApiSource(url, shape, api_shape)


# -- presets -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_builds_a_shape(name: str) -> None:
    data = load_preset(name)
    assert data["description"]
    shape, api = resolve_shape(name, None, {})
    assert isinstance(shape, SourceShape)
    assert (api is None) == (name == "seed")  # the seed preset keeps the fast path


def test_explicit_flags_override_the_preset() -> None:
    _, api = resolve_shape("drf", None, {"name": "path", "md5": None, "size": "bytes"})
    assert api is not None
    assert (api.items, api.name, api.size, api.md5, api.paginate) == \
        ("results", "path", "bytes", "md5", "url")


def test_an_api_file_over_a_preset_and_its_mistakes(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('items = "data"\npage_size = 10\npaginate = "offset"\n'
                    'page_param = "skip"\n')
    _, api = resolve_shape("drf", str(mine), {})
    assert api is not None and (api.items, api.name, api.paginate, api.page_size) == \
        ("data", "name", "offset", 10)
    mine.write_text('itmes = "data"\n')
    with pytest.raises(UsageError, match="unknown key 'itmes'"):
        resolve_shape(None, str(mine), {})
    mine.write_text("page_size = '10'\n")
    with pytest.raises(UsageError, match="page_size must be an integer"):
        resolve_shape(None, str(mine), {})
    mine.write_text("items = \n")
    with pytest.raises(UsageError, match="not TOML"):
        resolve_shape(None, str(mine), {})
    with pytest.raises(UsageError, match="cannot be read"):
        resolve_shape(None, str(tmp_path / "none.toml"), {})


@pytest.mark.parametrize(("given", "style"), [
    ({"items": "x", "next": "n", "next_param": "t"}, "token"),
    ({"items": "x", "next": "n"}, "url"),
    ({"items": "x", "page_param": "p"}, "page"),
    ({"items": "x"}, "link"),
])
def test_the_style_is_inferred_from_the_flags(given: dict[str, str], style: str) -> None:
    assert resolve_shape(None, None, given)[1].paginate == style  # type: ignore[union-attr]


def test_the_default_run_keeps_the_seed_fast_path(tmp_path: Path) -> None:
    options = build_options("http://127.0.0.1:9/", tmp_path / "d")
    assert options.api is None and "api" not in options.fingerprint()
    assert type(make_source(options)) is FileServerSource
    seeded = build_options("http://127.0.0.1:9/", tmp_path / "d", api="seed")
    assert seeded.fingerprint() == options.fingerprint()
    assert type(make_source(seeded)) is FileServerSource


def test_the_fingerprint_holds_the_shape_but_no_header(tmp_path: Path) -> None:
    url = "https://storage.example/storage/v1/b/B/o"
    gcs = build_options(url, tmp_path / "d", api="gcs")
    with_key = build_options(url, tmp_path / "d", api="gcs", headers=["X-Key: value-123456"])
    assert gcs.fingerprint()["api"]["md5"] == "md5Hash"  # type: ignore[index]
    assert gcs.fingerprint() == with_key.fingerprint()  # a header is not the run's identity
    other = build_options(url, tmp_path / "d", api="gcs", md5_path="md5")
    assert other.fingerprint() != gcs.fingerprint()  # a changed shape asks for --restart


def test_shape_flags_do_not_apply_to_other_sources(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--api"):
        build_options("s3://bucket/p", tmp_path / "d", api="gcs")
    with pytest.raises(UsageError, match="--header"):
        build_options(str(tmp_path / "urls.txt"), tmp_path / "d", from_file=True,
                      headers=["X-A: b123456"])


# -- pages of each shape -----------------------------------------------------------------------
def test_a_gcs_page_gives_names_sizes_hex_md5s_and_media_links() -> None:
    gcs = source("https://storage.example/storage/v1/b/B/o", "gcs")
    bodies = {"a/b c.txt": b"hello", "x": b""}
    page = {"kind": "storage#objects", "nextPageToken": "TOKEN2", "items": [
        {"name": name, "size": str(len(body)),
         "md5Hash": base64.b64encode(hashlib.md5(body).digest()).decode(),
         "mediaLink": f"https://storage.example/download/storage/v1/b/B/o/{i}?alt=media"}
        for i, (name, body) in enumerate(bodies.items())]}
    listed = gcs.parse(page, None, gcs.list_url)
    assert listed.next_token == "TOKEN2"
    assert listed.sizes == (5, 0)
    assert listed.md5s == (md5(b"hello"), md5(b""))
    assert [gcs.resolve(item) for item in listed.items] == [
        ("a/b c.txt", "https://storage.example/download/storage/v1/b/B/o/0?alt=media"),
        ("x", "https://storage.example/download/storage/v1/b/B/o/1?alt=media")]
    assert gcs.pages.request_url("TOKEN2") == gcs.list_url + "?pageToken=TOKEN2"
    last = gcs.parse({"kind": "storage#objects"}, "TOKEN2", gcs.list_url)  # no items at all
    assert last.items == () and last.next_token is None


def test_an_hf_tree_page_keeps_files_and_checks_their_sha256() -> None:
    url = "https://hub.example/api/models/org/repo/tree/main"
    hub = source(url, "hf-tree")
    sha = hashlib.sha256(b"weights").hexdigest()
    page = [{"type": "directory", "path": "sub", "oid": "1"},
            {"type": "file", "path": "sub/model.bin", "size": 7, "oid": "2",
             "lfs": {"oid": sha, "size": 7}},
            {"type": "file", "path": "README.md", "size": 3, "oid": "3"}]
    listed = hub.parse(page, None, url, [b"Link: <" + url.encode() +
                                         b'?cursor=abc>; rel="next"\r\n'])
    assert listed.items == ("sub/model.bin", "README.md")
    assert listed.md5s == (f"sha256:{sha}", "")
    assert listed.sizes == (7, 3)
    assert listed.next_token == url + "?cursor=abc"
    assert hub.resolve("sub/model.bin") == \
        ("sub/model.bin", "https://hub.example/org/repo/resolve/main/sub/model.bin")


def test_a_drf_page_resolves_relative_urls_against_the_page() -> None:
    url = "http://api.example/api/files/?page=2"
    drf = source("http://api.example/api/files/", "drf")
    page = {"count": 3, "next": "http://api.example/api/files/?page=3", "previous": None,
            "results": [{"name": "a", "size": 1, "md5": md5(b"a"), "url": "/media/a"},
                        {"name": "b", "size": None, "md5": None, "url": None}]}
    listed = drf.parse(page, "x", url)
    assert listed.total == 3 and listed.next_token == "http://api.example/api/files/?page=3"
    assert drf.resolve(listed.items[0]) == ("a", "http://api.example/media/a")
    assert drf.resolve(listed.items[1]) == ("b", "http://api.example/api/files/b")
    assert listed.sizes == (1, -1) and listed.md5s == (md5(b"a"), "")


def test_a_page_not_of_the_shape_is_refused_with_the_reason() -> None:
    drf = source("http://api.example/api/files/", "drf")
    for page, reason in (({"results": {"a": 1}}, "not a list"),
                         ({"results": [{"name": 5}]}, "item 0: --name 'name' is '5'"),
                         ({"results": [{"name": "a", "size": "big"}]}, "--size 'size'"),
                         ({"results": [{"name": "a", "md5": "xyz"}]}, "neither hex nor"),
                         ({"results": [], "next": "https://evil.example/p2"}, "listing's host"),
                         ({"results": [], "next": ["x"]}, "not a string")):
        with pytest.raises(PageError, match=reason):
            drf.parse(page, None, drf.list_url)


def test_a_name_holding_nul_never_becomes_a_url() -> None:
    drf = source("http://api.example/api/files/", "drf")
    listed = drf.parse({"results": [{"name": "a\0http://evil/x", "url": None},
                                    {"name": "b\0c", "url": "/media/b"}]}, None, drf.list_url)
    with pytest.raises(ValueError, match="NUL"):
        drf.resolve(listed.items[0])
    name, url = drf.resolve(listed.items[1])
    assert name == "b\0c" and url == "http://api.example/media/b"  # check_name refuses it


def test_seed_shaped_pages_read_by_the_json_source_match_the_fast_path() -> None:
    seed_fast = FileServerSource("http://h:1", SourceShape(), build_options(
        "http://h:1", "/tmp/x").timeouts)
    generic = JsonApiSource("http://h:1", SourceShape(),
                            ApiShape(items="FileNames", next="NextMarker",
                                     next_param="next-marker"))
    page = {"FileNames": ["a", "b/c", "d e"], "NextMarker": "m2"}
    assert generic.parse(page, None, generic.list_url).items == \
        seed_fast._validate(page, [], "u").items
    assert generic.pages.request_url("m2") == seed_fast.list_url("m2")
    assert [generic.resolve(i) for i in "a"] == [seed_fast.resolve(i) for i in "a"]
    assert list(generic.plain_urls(["a", "b"]) or []) == \
        list(seed_fast.plain_urls(["a", "b"]) or [])


# -- what the engine does with listed digests ----------------------------------------------
def test_a_body_unlike_its_listed_sha256_changed_since_it_was_listed() -> None:
    body = b"weights"
    sha = "sha256:" + hashlib.sha256(body).hexdigest()
    assert unlike_listing((7, sha), body, md5(body)) is None
    assert "SHA-256" in (unlike_listing((7, "sha256:" + "0" * 64), body, md5(body)) or "")
    assert unlike_listing((7, "sha256:" + "0" * 64), body, None) is None  # --no-verify
    assert "the listing gives 6" in (unlike_listing((6, ""), body, None) or "")


def test_the_lister_keeps_sizes_and_md5s_with_their_items_across_carries() -> None:
    first = ListedPage(("a", "b", "c"), "t2", None, (1, 2, 3), ("m1", "m2", "m3"))
    second = ListedPage(("d",), None, None, (4,), ("m4",))
    assert _joined((), second, None) is second
    joined = _joined(first, second, None, skip=2)
    assert (joined.items, joined.sizes, joined.md5s) == (("c", "d"), (3, 4), ("m3", "m4"))
    carried = _joined(("x",), second, "t3")  # carried in a token: nothing known of it
    assert (carried.items, carried.sizes, carried.md5s, carried.next_token) == \
        (("x", "d"), (-1, 4), ("", "m4"), "t3")
    cut = _cut(first, 2, "t2+")
    assert (cut.items, cut.sizes, cut.md5s, cut.next_token) == \
        (("a", "b"), (1, 2), ("m1", "m2"), "t2+")
