"""server/index_shape.py through App.handle, no sockets: nginx's HTML and JSON listings
written byte for byte as nginx 1.22.1 wrote them (the fixtures test_autoindex.py reads), the
tree's layout at every size, a walk of the whole tree with the crawler's parser, a million
files served without listing them, and the options it refuses."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from bulkfetch.errors import UsageError
from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.server.faults import FaultConfig
from bulkfetch.server.index_shape import IndexApp, Listed, Tree, nginx_html, nginx_json
from bulkfetch.server.options import ServeOptions, build_app
from bulkfetch.sources.autoindex import parse_listing
from bulkfetch.util.sizes import parse_size_spec

FIXTURES = Path(__file__).parent / "fixtures" / "autoindex"
HOST = "127.0.0.1:8123"
JAN_1 = 1735689600
SIZES = {
    "100%.bin": 12345, "<tag>&quot.txt": 4, "a b.txt": 5, "a&b.txt": 7, "a&copy.txt": 6,
    "a-very-long-file-name-that-runs-past-the-fifty-column-limit-of-nginx.txt": 123,
    "c+d.txt": 0, "café.txt": 1024, "hash#tag.txt": 11, "plain.dat": 9999, "q?x.txt": 9,
    "ten-thousand.dat": 10000, "日本.txt": 3145745,
}


def fixture_entries() -> list[Listed]:
    dirs = [Listed(name, True, JAN_1 + 86400) for name in ("sub dir", "ünï")]
    mtimes = {name: JAN_1 + 3660 * at for at, name in enumerate(sorted(SIZES))}
    files = [Listed(name, False, mtimes[name], SIZES[name])
             for name in sorted(SIZES, key=str.encode)]
    return dirs + files


def test_the_html_page_is_nginxs_byte_for_byte() -> None:
    assert nginx_html("/archive/", fixture_entries()) == \
        (FIXTURES / "nginx-exact.html").read_bytes()


def test_the_json_page_is_nginxs_byte_for_byte() -> None:
    assert nginx_json(fixture_entries()) == (FIXTURES / "nginx.json").read_bytes()
    assert nginx_json([]) == b"[\r\n]"


@pytest.mark.parametrize(("files", "fanout", "depth"), [
    (0, 50, 0), (1, 50, 0), (50, 50, 0), (51, 50, 1), (2500, 50, 1), (2501, 50, 2),
    (125_000, 50, 2), (125_001, 50, 3), (1_000_000, 50, 3), (10**10, 1000, 3), (7, 2, 2)])
def test_the_tree_is_as_deep_as_it_takes_and_no_directory_holds_more_than_fanout(
        files: int, fanout: int, depth: int) -> None:
    tree = Tree(files, fanout)
    assert tree.depth == depth
    if files:
        last = tree.path(files - 1, "f")
        assert last.count("/") == depth + 2  # /archive/ + one a level
        parts = last.split("/")[2:-1]
        assert tree.directory(parts) is not None
    assert len(tree.subdirectories(0, 0) if depth else tree.file_indices(0)) <= fanout


def make(files: int, fanout: int = 50, shape: str = "index", **options: object) -> IndexApp:
    app = build_app(ServeOptions(files=files, shape=shape, index_fanout=fanout,  # type: ignore[arg-type]
                                 file_size=parse_size_spec("uniform:0:3000"), **options),
                    port=8123)
    assert isinstance(app, IndexApp)
    return app


def get(app: IndexApp, target: str, method: str = "GET"):  # type: ignore[no-untyped-def]
    return app.handle(method, target, {"host": HOST})


@pytest.mark.parametrize("shape", ["index", "index-json"])
def test_a_walk_of_the_tree_finds_every_file_once_in_order_with_its_body(shape: str) -> None:
    app = make(130, fanout=4, shape=shape)  # 33 leaf directories, three levels
    dataset = SyntheticDataSet(130, 1000, 0, parse_size_spec("uniform:0:3000"))
    found, pending, pages = [], [f"http://{HOST}/archive/"], 0
    while pending:
        url = pending.pop()
        page = get(app, url.removeprefix(f"http://{HOST}"))
        pages += 1
        assert page.status == 200
        listing = parse_listing(page.body, dict(page.headers)["Content-Type"], url)
        assert len(listing.files) + len(listing.dirs) <= 4
        assert not (listing.files and listing.dirs)
        found += listing.files
        pending += [d.url for d in reversed(listing.dirs)]
    assert [f.name for f in found] == [dataset.name(i) for i in range(130)]
    assert pages == 1 + 3 + 9 + 33  # the top, 3 and 9 directories, 33 leaves
    for index, item in enumerate(found):
        assert item.size == dataset.size(index) and item.size_exact
        assert item.mtime == dataset.last_modified
        answer = get(app, item.url.removeprefix(f"http://{HOST}"))
        assert answer.status == 200 and answer.body == dataset.body(index)
        assert dict(answer.headers)["ETag"] == f'"{hashlib.md5(answer.body).hexdigest()}"'


def test_a_million_files_are_served_without_being_listed() -> None:
    started = time.perf_counter()
    app = make(1_000_000)
    root = get(app, "/archive/")
    deep = get(app, "/archive/d007/d049/d049/")  # the last leaf: files 999,950..999,999
    name = app.dataset.name(999_999)
    answer = get(app, f"/archive/d007/d049/d049/{name}")
    assert time.perf_counter() - started < 2.0
    assert root.body.count(b"<a href=") == 1 + 8  # ../ and d000..d007
    listing = parse_listing(deep.body, "text/html", f"http://{HOST}/archive/d007/d049/d049/")
    assert [f.name for f in listing.files] == [app.dataset.name(i)
                                               for i in range(999_950, 1_000_000)]
    assert answer.status == 200 and answer.body == app.dataset.body(999_999)


def test_directories_without_slash_move_and_misplaced_names_are_404() -> None:
    app = make(500)
    moved = get(app, "/archive/d003")
    assert moved.status == 301
    assert dict(moved.headers)["Location"] == f"http://{HOST}/archive/d003/"
    assert get(app, "/archive").status == 301
    name = app.dataset.name(157)
    assert get(app, f"/archive/d003/{name}").status == 200
    assert get(app, f"/archive/%64003/{name}").status == 200  # percent-encoded alike
    for target in (f"/archive/d002/{name}", f"/archive/{name}", f"/archive/d003/{name}/",
                   "/archive/d010/", "/archive/d0003/", "/archive/d003/d000/", "/",
                   "/archive/d003/f9999999999", "/archive/../list"):
        assert get(app, target).status == 404, target
    assert get(app, "/list").status == 200  # the seed API, beside the shape


def test_faults_hit_listing_pages_and_stale_sizes_are_misstated() -> None:
    failing = make(60, faults=FaultConfig(fail_rate=1.0))
    assert get(failing, "/archive/").status in (500, 503)
    assert get(failing, f"/archive/d001/{failing.dataset.name(55)}").status in (500, 503)
    stale = make(200, faults=FaultConfig(stale_rate=0.3))
    plan = stale.app.faults
    assert plan is not None
    wrong = set()
    for leaf in range(4):
        url = f"http://{HOST}/archive/d{leaf:03d}/"
        listing = parse_listing(get(stale, url.removeprefix(f"http://{HOST}")).body,
                                "text/html", url)
        wrong |= {f.name for f in listing.files
                  if f.size != stale.dataset.size(stale.dataset.index_of(f.name) or 0)}
    assert wrong == {stale.dataset.name(i) for i in range(200)
                     if plan.stale(stale.dataset.name(i)) == "size"}
    assert wrong


@pytest.mark.parametrize("options", [
    {"nested": True}, {"hostile_names": True}, {"index_fanout": 1},
    {"faults": FaultConfig(lie_md5=frozenset({"f0000000001"}))}])
def test_what_the_index_shapes_refuse(options: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        ServeOptions(files=10, shape="index", **options)  # type: ignore[arg-type]
