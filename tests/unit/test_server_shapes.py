"""`bulkfetch serve --shape` (server/shapes.py) through App.handle, no sockets: each shape's
page format as its public documentation gives it, pagination to the end (every name once),
tokens that survive a restart, --require-bearer, --lie-md5 / --stale-rate and
--redirect-files-to."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from click.testing import CliRunner

from bulkfetch.errors import UsageError
from bulkfetch.server.app import App, Response
from bulkfetch.server.command import SHAPE_CHOICES, serve
from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.server.faults import Fault, FaultConfig
from bulkfetch.server.gates import BearerGate, FileRedirect
from bulkfetch.server.hf_shape import git_blob_id, lfs_pointer
from bulkfetch.server.options import ServeOptions, build_app
from bulkfetch.server.shapes import GCS_BUCKET, HF_REPO, LISTING_PATHS, SHAPES, ShapeApp
from bulkfetch.sources.autoindex import parse_listing
from bulkfetch.util.sizes import parse_size_spec

HOST = "127.0.0.1:8123"
ORIGIN = f"http://{HOST}"
SHAPED = ("gcs", "link", "drf", "hf-tree")
INDEX_SHAPES = ("index", "index-json")  # more in test_server_index.py
LINK = re.compile(r'<([^>]*)>; rel="([a-z]+)"')


def make(shape: str, files: int = 25, page_size: int = 10, size: str = "uniform:0:3000",
         **options: object) -> ShapeApp | BearerGate | FileRedirect | App:
    return build_app(ServeOptions(files=files, page_size=page_size, shape=shape,  # type: ignore[arg-type]
                                  file_size=parse_size_spec(size), **options), port=8123)


def data(files: int = 25, page_size: int = 10, size: str = "uniform:0:3000",
         nested: bool = False) -> SyntheticDataSet:
    return SyntheticDataSet(files, page_size, 0, parse_size_spec(size), nested)


def ask(app: object, target: str, method: str = "GET", **headers: str) -> Response:
    sent = {"host": HOST, **{k.replace("_", "-").lower(): v for k, v in headers.items()}}
    return app.handle(method, target, sent)  # type: ignore[attr-defined]


def header(response: Response, name: str) -> str | None:
    values = [v for k, v in response.headers if k.lower() == name.lower()]
    assert len(values) <= 1, values
    return values[0] if values else None


def links(response: Response) -> dict[str, str]:
    return {rel: url for url, rel in LINK.findall(header(response, "Link") or "")}


def local(url: str) -> str:
    """An absolute URL of this server as a request target; it must point at ORIGIN."""
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}" == ORIGIN, url
    return parts.path + (f"?{parts.query}" if parts.query else "")


def body(response: Response) -> bytes:
    return b"".join(response.chunks) if response.chunks is not None else response.body


# One walk per shape: every page in order -> (items of every page, requests made)
def walk(app: object, shape: str, first: str | None = None,
         **headers: str) -> tuple[list[dict], int]:
    if shape in INDEX_SHAPES:
        return walk_tree(app, first or LISTING_PATHS[shape], **headers)
    target: str | None = first or LISTING_PATHS[shape]
    items: list[dict] = []
    requests = 0
    while target is not None:
        response = ask(app, target, **headers)
        requests += 1
        assert response.status == 200, (target, response.body)
        page = json.loads(response.body)
        if shape == "gcs":
            assert page["kind"] == "storage#objects"
            items += page.get("items", [])
            token = page.get("nextPageToken")
            base = target.split("?")[0]
            limit = parse_qs(urlsplit(target).query).get("maxResults")
            target = None if token is None else (
                f"{base}?pageToken={quote(token)}" + (f"&maxResults={limit[0]}" if limit else ""))
        elif shape == "drf":
            assert set(page) == {"count", "next", "previous", "results"}
            items += page["results"]
            target = None if page["next"] is None else local(page["next"])
        else:
            assert isinstance(page, list)
            items += page
            following = links(response).get("next")
            target = None if following is None else local(following)
        assert requests < 1000
    return items, requests


def walk_tree(app: object, top: str, **headers: str) -> tuple[list[dict], int]:
    """--shape index and index-json: every directory's page, read by the parser a crawler
    uses, depth first in listing order -> ({"name", "url", "size"} of every file, requests)."""
    items: list[dict] = []
    requests = 0
    pending = [f"{ORIGIN}{top}"]
    while pending:
        url = pending.pop()
        response = ask(app, local(url), **headers)
        requests += 1
        assert response.status == 200, (url, response.body)
        listing = parse_listing(response.body, header(response, "Content-Type"), url)
        items += [{"name": f.name, "url": f.url, "size": f.size} for f in listing.files]
        pending += [d.url for d in reversed(listing.dirs)]
    return items, requests


def name_of(shape: str, item: dict) -> str:
    return item["path"] if shape == "hf-tree" else item["name"]


def download_target(shape: str, item: dict) -> str:
    if shape in INDEX_SHAPES:
        return local(item["url"])
    if shape == "gcs":
        return local(item["mediaLink"])
    if shape == "link":
        return local(item["browser_download_url"])
    if shape == "drf":
        return local(item["url"])
    return f"/{HF_REPO}/resolve/main/{quote(item['path'])}"


def listed_md5(shape: str, item: dict) -> str | None:
    if shape == "gcs":
        return base64.b64decode(item["md5Hash"]).hex()
    if shape in ("link", "drf"):
        return item["md5"]
    return None


def listed_sha256(shape: str, item: dict) -> str | None:
    if shape == "link":
        assert item["digest"].startswith("sha256:")
        return item["digest"].removeprefix("sha256:")
    if shape == "hf-tree":
        return item["lfs"]["oid"]
    return None


def listed_size(shape: str, item: dict) -> int:
    if shape == "gcs":
        assert isinstance(item["size"], str)  # uint64 as a JSON string, as GCS sends it
        return int(item["size"])
    return item["size"]


# -- every shape: the whole listing, and every file through it --------------------------
@pytest.mark.parametrize("shape", SHAPED)
def test_walking_every_page_lists_every_name_once_with_its_true_size_and_digests(
        shape: str) -> None:
    app, dataset = make(shape), data()
    items, requests = walk(app, shape)
    assert requests == 3  # 25 files, 10 a page
    assert [name_of(shape, item) for item in items] == [dataset.name(i) for i in range(25)]
    for index, item in enumerate(items):
        expected = dataset.body(index)
        assert listed_size(shape, item) == len(expected)
        md5, sha256 = listed_md5(shape, item), listed_sha256(shape, item)
        assert md5 is None or md5 == hashlib.md5(expected).hexdigest()
        assert sha256 is None or sha256 == hashlib.sha256(expected).hexdigest()
        assert md5 is not None or sha256 is not None
        answer = ask(app, download_target(shape, item))
        assert answer.status == 200, answer.body
        assert body(answer) == expected
        assert header(answer, "ETag") == f'"{hashlib.md5(expected).hexdigest()}"'


@pytest.mark.parametrize("shape", SHAPED)
def test_an_empty_data_set_is_one_empty_page(shape: str) -> None:
    items, requests = walk(make(shape, files=0), shape)
    assert items == [] and requests == 1


@pytest.mark.parametrize("shape", SHAPED)
def test_the_seed_api_is_served_beside_the_shape(shape: str) -> None:
    app = make(shape)
    assert json.loads(ask(app, "/list").body)["FileNames"][0] == "f0000000000"
    assert body(ask(app, "/get/f0000000003")) == data().body(3)


@pytest.mark.parametrize("shape", SHAPED)
def test_pages_are_the_same_after_a_restart_so_a_listing_resumes(shape: str) -> None:
    """Tokens, cursors, page numbers and next URLs are pure functions of the data set: the
    second page's target from one server gives the same page from a new one."""
    first, again = make(shape), make(shape)
    page = ask(first, LISTING_PATHS[shape])
    assert ask(again, LISTING_PATHS[shape]).body == page.body
    if shape == "gcs":
        second = f"{LISTING_PATHS[shape]}?pageToken={json.loads(page.body)['nextPageToken']}"
    elif shape == "drf":
        second = local(json.loads(page.body)["next"])
    else:
        second = local(links(page)["next"])
    assert ask(first, second).body == ask(again, second).body
    assert ask(again, second).status == 200


@pytest.mark.parametrize("shape", SHAPED)
def test_listing_urls_follow_the_host_the_client_named(shape: str) -> None:
    app = make(shape)
    answer = app.handle("GET", LISTING_PATHS[shape], {"host": "localhost:9"})
    text = answer.body.decode() + (header(answer, "Link") or "")
    assert "http://localhost:9/" in text and ORIGIN not in text
    # A Host that could break out of a URL is not used: the address the server listens on
    hostile = app.handle("GET", LISTING_PATHS[shape], {"host": 'x">; rel="next", <http://evil'})
    text = hostile.body.decode() + (header(hostile, "Link") or "")
    assert "evil" not in text


@pytest.mark.parametrize("shape", SHAPED)
def test_other_methods_are_405(shape: str) -> None:
    answer = ask(make(shape), LISTING_PATHS[shape], method="DELETE")
    assert answer.status == 405 and header(answer, "Allow") == "GET, HEAD"


def test_seed_shape_builds_the_plain_app_with_nothing_in_front() -> None:
    """The default shape's speed is the seed App's: no wrapper, no per-request dispatch."""
    assert type(build_app(ServeOptions(files=10))) is App
    assert SHAPES == SHAPE_CHOICES


# -- gcs -------------------------------------------------------------------------------
def test_gcs_object_resource_has_the_documented_fields() -> None:
    app, dataset = make("gcs", nested=True), data(nested=True)
    page = json.loads(ask(app, f"/storage/v1/b/{GCS_BUCKET}/o").body)
    assert list(page) == ["kind", "nextPageToken", "items"]
    item = page["items"][0]
    name = dataset.name(0)
    assert "/" in name
    assert item["kind"] == "storage#object" and item["name"] == name
    assert item["bucket"] == GCS_BUCKET and item["storageClass"] == "STANDARD"
    assert item["generation"].isdigit() and item["metageneration"] == "1"
    assert item["id"] == f"{GCS_BUCKET}/{name}/{item['generation']}"
    assert item["timeCreated"] == "2025-01-01T00:00:00.000Z" == item["updated"]
    assert base64.b64decode(item["md5Hash"]) == hashlib.md5(dataset.body(0)).digest()
    assert base64.b64decode(item["etag"]) != hashlib.md5(dataset.body(0)).digest()
    encoded = quote(name, safe="")
    assert item["selfLink"] == f"{ORIGIN}/storage/v1/b/{GCS_BUCKET}/o/{encoded}"
    assert item["mediaLink"] == (f"{ORIGIN}/download/storage/v1/b/{GCS_BUCKET}/o/{encoded}"
                                 f"?generation={item['generation']}&alt=media")
    # objects.get: the resource without alt=media, the bytes with it, on both paths
    for prefix in ("/storage", "/download/storage"):
        target = f"{prefix}/v1/b/{GCS_BUCKET}/o/{encoded}"
        assert json.loads(ask(app, target).body) == item
        assert body(ask(app, target + "?alt=media")) == dataset.body(0)
    # The name is one path segment: '/' must come encoded
    raw = ask(app, f"/storage/v1/b/{GCS_BUCKET}/o/{name}?alt=media")
    assert raw.status == 404 and json.loads(raw.body)["error"]["code"] == 404


def test_gcs_max_results_pages_and_tokens() -> None:
    app, dataset = make("gcs", files=23), data(files=23)
    items, requests = walk(app, "gcs", f"/storage/v1/b/{GCS_BUCKET}/o?maxResults=4")
    assert requests == 6 and [i["name"] for i in items] == [dataset.name(i) for i in range(23)]
    # more than --page-size is capped by it, as GCS caps maxResults at 1,000
    page = json.loads(ask(app, f"/storage/v1/b/{GCS_BUCKET}/o?maxResults=500").body)
    assert len(page["items"]) == 10
    token = page["nextPageToken"]
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for bad in (forged, "x", "../etc", "AAAAAAAAAAA"):
        answer = ask(app, f"/storage/v1/b/{GCS_BUCKET}/o?pageToken={bad}")
        assert answer.status == 400
        assert json.loads(answer.body)["error"]["errors"][0]["reason"] == "invalid"
    for bad in ("maxResults=0", "maxResults=x", "prefix=f", "delimiter=/"):
        assert ask(app, f"/storage/v1/b/{GCS_BUCKET}/o?{bad}").status == 400, bad
    missing = ask(app, "/storage/v1/b/other/o")
    assert missing.status == 404 and "bucket" in json.loads(missing.body)["error"]["message"]


def test_gcs_token_of_another_shape_or_data_set_is_refused() -> None:
    hf = make("hf-tree")
    cursor = parse_qs(urlsplit(links(ask(hf, LISTING_PATHS["hf-tree"]))["next"]).query)
    answer = ask(make("gcs"), f"/storage/v1/b/{GCS_BUCKET}/o?pageToken={cursor['cursor'][0]}")
    assert answer.status == 400
    token = json.loads(ask(make("gcs", files=40), LISTING_PATHS["gcs"]).body)["nextPageToken"]
    assert ask(make("gcs", files=41), f"{LISTING_PATHS['gcs']}?pageToken={token}").status == 400


# -- link ------------------------------------------------------------------------------
def test_link_headers_name_prev_next_last_first_as_github_does() -> None:
    app = make("link", files=25)
    first = ask(app, "/files")
    assert links(first) == {"next": f"{ORIGIN}/files?page=2&per_page=10",
                            "last": f"{ORIGIN}/files?page=3&per_page=10"}
    assert [rel for _, rel in LINK.findall(header(first, "Link") or "")] == ["next", "last"]
    middle = ask(app, "/files?page=2&per_page=10")
    assert [rel for _, rel in LINK.findall(header(middle, "Link") or "")] == [
        "prev", "next", "last", "first"]
    assert links(middle)["prev"] == f"{ORIGIN}/files?page=1&per_page=10"
    last = ask(app, "/files?page=3")
    assert set(links(last)) == {"prev", "first"}
    assert len(json.loads(last.body)) == 5
    assert header(last, "X-Total") == "25" and header(last, "X-Total-Pages") == "3"
    assert header(last, "X-Next-Page") == "" and header(last, "X-Prev-Page") == "2"
    assert json.loads(ask(app, "/files?page=9").body) == []
    small, requests = walk(app, "link", "/files?per_page=7")
    assert requests == 4 and len(small) == 25
    assert [item["id"] for item in small] == list(range(1, 26))
    for bad in ("page=0", "page=x", "per_page=0", "page=-1"):
        assert ask(app, f"/files?{bad}").status == 400, bad


def test_link_item_fields() -> None:
    item = json.loads(ask(make("link", nested=True), "/files").body)[0]
    name = data(nested=True).name(0)
    assert item["name"] == item["path"] == name and item["type"] == "file"
    assert item["download_url"] == item["browser_download_url"] == f"{ORIGIN}/raw/{name}"
    assert item["state"] == "uploaded" and item["created_at"] == "2025-01-01T00:00:00Z"


# -- drf -------------------------------------------------------------------------------
def test_drf_page_numbers_next_and_previous_as_drf_builds_them() -> None:
    app = make("drf", files=25)
    first = json.loads(ask(app, "/api/files/").body)
    assert first["count"] == 25 and first["previous"] is None
    assert first["next"] == f"{ORIGIN}/api/files/?page=2"
    second = json.loads(ask(app, "/api/files/?page=2&format=json").body)
    assert second["next"] == f"{ORIGIN}/api/files/?format=json&page=3"  # keys sorted, as DRF
    assert second["previous"] == f"{ORIGIN}/api/files/?format=json"  # page 1: no page=
    third = json.loads(ask(app, "/api/files/?page=3").body)
    assert third["next"] is None and third["previous"] == f"{ORIGIN}/api/files/?page=2"
    assert json.loads(ask(app, "/api/files/?page=last").body) == third
    assert set(third["results"][0]) == {"name", "size", "md5", "url"}
    for bad in ("page=4", "page=0", "page=x"):
        answer = ask(app, f"/api/files/?{bad}")
        assert answer.status == 404 and json.loads(answer.body) == {"detail": "Invalid page."}
    moved = ask(app, "/api/files?page=2")
    assert moved.status == 301 and header(moved, "Location") == "/api/files/?page=2"


def test_drf_limit_offset_walk_and_links() -> None:
    app, dataset = make("drf", files=25), data()
    items, requests = walk(app, "drf", "/api/files/?limit=4")
    assert requests == 7 and [i["name"] for i in items] == [dataset.name(i) for i in range(25)]
    page = json.loads(ask(app, "/api/files/?limit=4&offset=6").body)
    assert page["next"] == f"{ORIGIN}/api/files/?limit=4&offset=10"
    assert page["previous"] == f"{ORIGIN}/api/files/?limit=4&offset=2"
    near = json.loads(ask(app, "/api/files/?limit=4&offset=3").body)
    assert near["previous"] == f"{ORIGIN}/api/files/?limit=4"  # offset 0 is left out
    # as DRF: a bad limit is the default (capped by --page-size), a bad offset 0
    assert len(json.loads(ask(app, "/api/files/?limit=x").body)["results"]) == 10
    assert len(json.loads(ask(app, "/api/files/?limit=100").body)["results"]) == 10
    assert json.loads(ask(app, "/api/files/?offset=-3").body)["previous"] is None
    assert json.loads(ask(app, "/api/files/?offset=99").body)["results"] == []


# -- hf-tree ---------------------------------------------------------------------------
def test_hf_tree_items_are_lfs_files_as_the_hub_lists_them() -> None:
    app, dataset = make("hf-tree", nested=True), data(nested=True)
    item = json.loads(ask(app, f"/api/models/{HF_REPO}/tree/main").body)[0]
    assert set(item) == {"type", "oid", "size", "path", "lfs"} and item["type"] == "file"
    expected = dataset.body(0)
    sha256 = hashlib.sha256(expected).digest()
    pointer = lfs_pointer(sha256, len(expected))
    assert pointer.startswith(b"version https://git-lfs.github.com/spec/v1\noid sha256:")
    assert item["lfs"] == {"oid": sha256.hex(), "size": len(expected),
                           "pointerSize": len(pointer)}
    assert item["oid"] == git_blob_id(pointer) == hashlib.sha1(
        b"blob %d\0" % len(pointer) + pointer).hexdigest()
    assert item["path"] == dataset.name(0) and "/" in item["path"]
    # huggingface_hub asks .../tree/main/ (an empty path) with recursive and expand
    hub = ask(app, f"/api/datasets/{HF_REPO}/tree/main/?recursive=True&expand=False")
    following = links(hub)["next"]
    assert following.startswith(f"{ORIGIN}/api/datasets/{HF_REPO}/tree/main?")
    assert parse_qs(urlsplit(following).query).keys() == {"recursive", "expand", "cursor"}
    for prefix in ("", "/datasets"):
        answer = ask(app, f"{prefix}/{HF_REPO}/resolve/main/{dataset.name(0)}")
        assert body(answer) == expected


def test_hf_tree_errors() -> None:
    app = make("hf-tree")
    for target, status, code in (
            ("/api/models/other/repo/tree/main", 404, "RepoNotFound"),
            (f"/api/models/{HF_REPO}/tree/v2", 404, "RevisionNotFound"),
            (f"/{HF_REPO}/resolve/v2/f0000000001", 404, "RevisionNotFound"),
            ("/other/repo/resolve/main/f0000000001", 404, "RepoNotFound"),
            (f"/api/models/{HF_REPO}/tree/main/sub", 400, None),
            (f"/api/models/{HF_REPO}/tree/main?cursor=forged", 400, None)):
        answer = ask(app, target)
        assert answer.status == status, target
        assert header(answer, "X-Error-Code") == code
        assert "error" in json.loads(answer.body)


# -- --require-bearer ------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_every_request_without_the_bearer_token_is_401(shape: str) -> None:
    app = make(shape, bearer_token="s3cr3t-T0ken")
    assert isinstance(app, BearerGate)
    listing = LISTING_PATHS.get(shape, "/list")
    for target in (listing, "/get/f0000000001", "/list"):
        missing = ask(app, target)
        assert missing.status == 401, target
        assert header(missing, "WWW-Authenticate") == 'Bearer realm="bulkfetch"'
        for wrong in ("Bearer nope", "Basic czNjcjN0LVQwa2Vu", "Bearer s3cr3t-T0ken2",
                      "s3cr3t-T0ken", "Bearer"):
            refused = ask(app, target, authorization=wrong)
            assert refused.status == 401, wrong
            assert "s3cr3t" not in refused.body.decode() + str(refused.headers)
            assert (header(refused, "WWW-Authenticate") or "").startswith("Bearer realm=")
        assert ask(app, target, authorization="Bearer s3cr3t-T0ken").status == 200
        assert ask(app, target, authorization="bearer s3cr3t-T0ken").status == 200
    if shape != "seed":
        items, _ = walk(app, shape, authorization="Bearer s3cr3t-T0ken")
        assert len(items) == 25


# -- --lie-md5, --stale-rate -----------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPED)
def test_lie_md5_misstates_exactly_the_named_files_digests(shape: str) -> None:
    dataset = data()
    liars = {dataset.name(3), dataset.name(17)}
    app = make(shape, faults=FaultConfig(lie_md5=frozenset(liars)))
    items, _ = walk(app, shape)
    wrong = set()
    for index, item in enumerate(items):
        expected = dataset.body(index)
        assert listed_size(shape, item) == len(expected)
        digests = [(listed_md5(shape, item), hashlib.md5(expected).hexdigest()),
                   (listed_sha256(shape, item), hashlib.sha256(expected).hexdigest())]
        stated = [(said, true) for said, true in digests if said is not None]
        if any(said != true for said, true in stated):
            assert all(said != true for said, true in stated)  # every digest lies alike
            wrong.add(name_of(shape, item))
        # the file itself is served as it is
        assert body(ask(app, download_target(shape, item))) == expected
    assert wrong == liars


@pytest.mark.parametrize("shape", SHAPED)
def test_stale_rate_misstates_a_share_of_names_by_seed(shape: str) -> None:
    dataset = data(files=200, page_size=50)
    app = make(shape, files=200, page_size=50, faults=FaultConfig(stale_rate=0.2))
    plan = app.app.faults  # type: ignore[union-attr]
    items, _ = walk(app, shape)
    sizes_wrong, digests_wrong = set(), set()
    for index, item in enumerate(items):
        expected = dataset.body(index)
        if listed_size(shape, item) != len(expected):
            sizes_wrong.add(index)
        md5, sha = listed_md5(shape, item), listed_sha256(shape, item)
        if (md5 or sha) not in (hashlib.md5(expected).hexdigest(),
                                hashlib.sha256(expected).hexdigest()):
            digests_wrong.add(index)
    kinds = {i: plan.stale(dataset.name(i)) for i in range(200)}
    assert digests_wrong == {i for i, kind in kinds.items() if kind is not None}
    assert sizes_wrong == {i for i, kind in kinds.items() if kind == "size"}
    assert 20 < len(digests_wrong) < 60 and sizes_wrong


def test_lie_md5_applies_to_s3_listings_too() -> None:
    name = "f0000000004"
    plain = build_app(ServeOptions(files=10, s3_bucket="bkt"))
    lying = build_app(ServeOptions(files=10, s3_bucket="bkt",
                                   faults=FaultConfig(lie_md5=frozenset({name}))))
    etag = dict(ask(plain, f"/bkt/{name}").headers)["ETag"]
    said = ask(lying, "/bkt?list-type=2").body.decode()
    assert said.count("<ETag>") == 10 and etag.replace('"', "&quot;") not in said
    assert ask(lying, f"/bkt/{name}").body == ask(plain, f"/bkt/{name}").body


# -- --redirect-files-to ---------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_file_gets_are_redirected_to_the_other_origin_and_listings_are_not(shape: str) -> None:
    other = "http://127.0.0.2:9001"
    app = make(shape, redirect_files_to=other + "/", bearer_token="tok")
    assert isinstance(app, BearerGate) and isinstance(app.inner, FileRedirect)
    auth = {"authorization": "Bearer tok"}
    if shape == "seed":
        targets = ["/get/f0000000002"]
    else:
        items, _ = walk(app, shape, **auth)
        assert len(items) == 25  # listings answered here, not redirected
        targets = [download_target(shape, item) for item in items[:3]]
    for target in targets:
        assert ask(app, target).status == 401  # the token is checked first
        for method in ("GET", "HEAD"):
            moved = ask(app, target, method=method, **auth)
            assert moved.status == 302 and header(moved, "Location") == other + target
            assert moved.fault is Fault.NONE
    # what is not a file's bytes is answered here
    assert ask(app, "/list", **auth).status == 200
    if shape == "gcs":
        name = quote(data().name(1), safe="")
        assert ask(app, f"/storage/v1/b/{GCS_BUCKET}/o/{name}", **auth).status == 200


# -- faults apply to shaped pages and files ----------------------------------------------
@pytest.mark.parametrize("shape", SHAPED)
def test_fault_switches_apply_to_list_pages_and_files(shape: str) -> None:
    app = make(shape, faults=FaultConfig(fail_rate=1.0))
    page = ask(app, LISTING_PATHS[shape])
    assert page.status in (500, 503) and page.fault is Fault.FAIL
    clean = make(shape)
    item = walk(clean, shape)[0][0]
    answer = ask(app, download_target(shape, item))
    assert answer.status in (500, 503) and answer.fault is Fault.FAIL
    # Faults decided per attempt: the same seed, the same sequence on a new server
    first, again = (make(shape, faults=FaultConfig(fail_rate=0.5)) for _ in range(2))
    assert [ask(first, LISTING_PATHS[shape]).status for _ in range(8)] == \
        [ask(again, LISTING_PATHS[shape]).status for _ in range(8)]


def test_hostile_names_are_listed_escaped_and_served() -> None:
    app = make("gcs", files=12, hostile_names=True)
    items, _ = walk(app, "gcs")
    names = [item["name"] for item in items]
    assert "../x" in names and "nul\x00byte" in names and "bad-utf8-\udcff" in names
    assert len(names) == 12 + 23  # the extras, one duplicate name among them
    traversal = next(item for item in items if item["name"] == "a/../../x")
    assert ask(app, local(traversal["mediaLink"])).status == 200


def test_a_root_tree_is_listed_in_its_order(tmp_path: Path) -> None:
    for name in ("b", "a/1 x", "a/2"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode() * 3)
    app = make("drf", root=str(tmp_path), page_size=2)
    items, requests = walk(app, "drf")
    assert [i["name"] for i in items] == ["a/1 x", "a/2", "b"] and requests == 2
    assert items[0]["url"] == f"{ORIGIN}/media/a/1%20x"
    assert body(ask(app, local(items[0]["url"]))) == b"a/1 x" * 3


# -- options and flags -------------------------------------------------------------------
@pytest.mark.parametrize(("options", "words"), [
    ({"shape": "ftp"}, "--shape 'ftp'"),
    ({"shape": "gcs", "s3_bucket": "bkt"}, "exclude each other"),
    ({"shape": "gcs", "huge_page": 5}, "--huge-page"),
    ({"shape": "drf", "bad_pages": frozenset({"loop"})}, "--bad-pages"),
    ({"bearer_token": "two words"}, "--require-bearer"),
    ({"bearer_token": ""}, "--require-bearer"),
    ({"bearer_token": "t", "s3_bucket": "bkt"}, "--s3-credentials"),
    ({"redirect_files_to": "ftp://h:1"}, "http://"),
    ({"redirect_files_to": "http://h:1/path"}, "just the origin"),
    ({"redirect_files_to": "http://u:p@h:1"}, "no user"),
    ({"redirect_files_to": "http://h:99999"}, "not a URL"),
    ({"redirect_files_to": "http://h", "s3_bucket": "bkt"}, "not to --s3"),
    ({"faults": FaultConfig(lie_md5=frozenset({"f0000000001"}))}, "--lie-md5"),
    ({"faults": FaultConfig(stale_rate=0.1)}, "--stale-rate"),
    ({"shape": "gcs", "faults": FaultConfig(lie_md5=frozenset({"nope"}))}, "'nope'"),
])
def test_options_refuse_what_cannot_work(options: dict[str, object], words: str) -> None:
    with pytest.raises(UsageError, match=re.escape(words)):
        ServeOptions(files=10, **options)  # type: ignore[arg-type]


def test_the_command_reports_clear_errors_and_documents_every_shape(tmp_path: Path) -> None:
    result = CliRunner().invoke(serve, ["--shape", "gcs", "--s3", "--port", "0"])
    assert result.exit_code == 2 and "exclude each other" in result.output
    result = CliRunner().invoke(serve, ["--shape", "nope"])
    assert result.exit_code == 2 and "'nope' is not one of" in result.output
    result = CliRunner().invoke(serve, ["--lie-md5", "f9", "--shape", "drf", "--port", "0"])
    assert result.exit_code == 2 and "no such file" in result.output
    result = CliRunner().invoke(serve, ["--shape", "link", "--export-static",
                                        str(tmp_path / "x")])
    assert result.exit_code == 2 and "--shape link" in result.output
    text = CliRunner().invoke(serve, ["--help"]).output
    for words in ("--shape", "--require-bearer", "--lie-md5", "--redirect-files-to",
                  "storage#objects", "md5Hash", 'rel="next"', "pointerSize", '"previous"',
                  "/media/NAME", "/raw/NAME", "resolve/main/PATH"):
        assert words in text, words
