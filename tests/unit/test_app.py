"""The seed API over a data set, called directly through App.handle (no sockets)."""

from __future__ import annotations

import hashlib
import json
from email.utils import formatdate
from urllib.parse import quote

import pytest

from bulkfetch.server.app import (
    BAD_TOKEN_BODY,
    NOT_FOUND_BODY,
    App,
    Response,
    parse_range,
    render_page,
)
from bulkfetch.server.dataset import EPOCH_2025, SyntheticDataSet
from bulkfetch.server.faults import Fault, FaultConfig, FaultPlan
from bulkfetch.server.hostile import (
    COLLISION_NAMES,
    MALFORMED_NAMES,
    TRAVERSAL_NAMES,
    BadPages,
    HostileNames,
    hostile_body,
)
from bulkfetch.util.sizes import parse_size_spec

NAME = "f0000000004"


def dataset(files: int = 2500, page_size: int = 1000, size: str = "1000") -> SyntheticDataSet:
    return SyntheticDataSet(files, page_size, 0, parse_size_spec(size))


def get(app: App, target: str, **headers: str) -> Response:
    return app.handle("GET", target, {k.replace("_", "-").lower(): v for k, v in headers.items()})


def header(response: Response, name: str) -> str | None:
    values = [v for k, v in response.headers if k.lower() == name.lower()]
    assert len(values) <= 1, values
    return values[0] if values else None


def body(response: Response) -> bytes:
    if response.chunks is not None:
        return b"".join(response.chunks)
    return response.body


def walk(app: App) -> list[dict]:
    pages, target = [], "/list"
    while True:
        response = get(app, target)
        assert response.status == 200, response.body
        page = json.loads(response.body)
        pages.append(page)
        if "NextMarker" not in page:
            return pages
        target = "/list?next-marker=" + quote(page["NextMarker"])
        assert len(pages) < 1000


# -- listing ---------------------------------------------------------------------------
def test_list_walk() -> None:
    data = dataset()
    app = App(data)
    pages = walk(app)
    assert [len(p["FileNames"]) for p in pages] == [1000, 1000, 500]
    names = [n for p in pages for n in p["FileNames"]]
    assert names == [data.name(i) for i in range(2500)]
    first = get(app, "/list")
    assert header(first, "Content-Type") == "application/json"
    assert header(first, "X-Total-Files") == "2500"
    assert first.body == render_page(pages[0]["FileNames"], pages[0]["NextMarker"])
    assert first.body.endswith(b"}\n") and b" " not in first.body


def test_list_tokens_are_stable_across_app_instances() -> None:
    token = json.loads(get(App(dataset()), "/list").body)["NextMarker"]
    response = get(App(dataset()), "/list?next-marker=" + token)
    assert response.status == 200
    assert json.loads(response.body)["FileNames"][0] == "f0000001000"
    other = App(SyntheticDataSet(2500, 1000, 1, parse_size_spec("1000")))
    assert get(other, "/list?next-marker=" + token).status == 400


@pytest.mark.parametrize(
    "query",
    ["next-marker=forged", "next-marker=", "next-marker=AAAAAAAAAAAAAAAAAAAAAAAAAAAA",
     "next-marker=%C3%A9", "next-marker=" + "A" * 9000],
)
def test_list_refuses_forged_tokens(query: str) -> None:
    response = get(App(dataset()), "/list?" + query)
    assert response.status == 400
    assert response.body == BAD_TOKEN_BODY
    assert header(response, "Content-Type") == "application/json"


def test_list_refuses_a_valid_mac_over_an_out_of_range_cursor() -> None:
    app = App(dataset())
    token = app.tokens.encode((3).to_bytes(8, "big"))  # only pages 0..2 exist
    assert get(app, "/list?next-marker=" + token).status == 400


def test_list_ignores_other_query_parameters() -> None:
    app = App(dataset())
    assert get(app, "/list?foo=bar").body == get(app, "/list").body


def test_total_files_header_can_be_left_out() -> None:
    response = get(App(dataset(), show_total=False), "/list")
    assert response.status == 200
    assert header(response, "X-Total-Files") is None
    assert header(get(App(dataset(files=0)), "/list"), "X-Total-Files") == "0"


def test_empty_data_set_lists_one_empty_page() -> None:
    response = get(App(dataset(files=0)), "/list")
    assert json.loads(response.body) == {"FileNames": []}


# -- routing ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "target",
    ["/", "/lists", "/get", "/get/", "/get/nope", "/get/f0000002500", "/get/f000000004",
     "/get/%ff%fe", "/GET/f0000000004", "/list/", "//list"],
)
def test_unknown_targets_are_404(target: str) -> None:
    response = get(App(dataset()), target)
    assert response.status == 404
    assert response.body == NOT_FOUND_BODY


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "get"])
def test_other_methods_are_405(method: str) -> None:
    response = App(dataset()).handle(method, "/get/" + NAME, {})
    assert response.status == 405
    assert header(response, "Allow") == "GET, HEAD"
    assert json.loads(response.body)["error"]


# -- GET and HEAD ----------------------------------------------------------------------
def test_get_a_file() -> None:
    data = dataset()
    response = get(App(data), "/get/" + NAME)
    assert response.status == 200
    assert response.body == data.body(4) and len(response.body) == 1000
    assert response.content_length == 1000
    assert header(response, "ETag") == '"' + hashlib.md5(data.body(4)).hexdigest() + '"'
    assert header(response, "Last-Modified") == "Wed, 01 Jan 2025 00:00:00 GMT"
    assert header(response, "Accept-Ranges") == "bytes"
    assert header(response, "Content-Type") == "application/octet-stream"


def test_get_ignores_the_query_and_decodes_percent_escapes() -> None:
    data = dataset()
    assert get(App(data), "/get/" + NAME + "?x=1").body == data.body(4)
    assert get(App(data), "/get/%66%30000000004").body == data.body(4)


def test_head_has_length_but_no_body() -> None:
    app = App(dataset())
    response = app.handle("HEAD", "/get/" + NAME, {})
    assert response.status == 200
    assert response.body == b"" and response.chunks is None
    assert response.content_length == 1000
    assert header(response, "ETag") == header(get(app, "/get/" + NAME), "ETag")
    ranged = app.handle("HEAD", "/get/" + NAME, {"range": "bytes=10-19"})
    assert ranged.status == 206 and ranged.content_length == 10 and ranged.body == b""


def test_large_body_is_streamed() -> None:
    data = dataset(files=3, size="3m")
    response = get(App(data), "/get/f0000000001")
    assert response.status == 200 and response.body == b""
    assert response.content_length == 3 * 1024 * 1024
    assert body(response) == data.body(1)
    part = get(App(data), "/get/f0000000001", range="bytes=1000000-2999999")
    assert part.status == 206 and part.content_length == 2_000_000
    assert body(part) == data.body(1)[1_000_000:3_000_000]


# -- Range ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "start", "stop"),
    [
        ("bytes=0-0", 0, 1),
        ("bytes=100-199", 100, 200),
        ("bytes=990-", 990, 1000),
        ("bytes=990-5000", 990, 1000),
        ("bytes=-10", 990, 1000),
        ("bytes=-5000", 0, 1000),
        ("bytes=999-999", 999, 1000),
        ("Bytes = 5-9", 5, 10),
    ],
)
def test_range_forms(value: str, start: int, stop: int) -> None:
    data = dataset()
    response = get(App(data), "/get/" + NAME, range=value)
    assert response.status == 206
    assert response.body == data.body(4)[start:stop]
    assert header(response, "Content-Range") == f"bytes {start}-{stop - 1}/1000"
    assert response.content_length == stop - start


@pytest.mark.parametrize(
    "value",
    ["bytes=0-1,5-6", "bytes=5-2", "bytes=abc", "bytes=", "bytes=-", "items=0-5", "bytes 0-5",
     "bytes=5", "bytes=--5", "bytes=+5-9", "bytes=1_0-20", "bytes=\u0661-\u0665",
     "bytes=0x1-5", "bytes=5 - 9"],
)
def test_ignored_ranges_give_the_whole_body(value: str) -> None:
    data = dataset()
    response = get(App(data), "/get/" + NAME, range=value)
    assert response.status == 200
    assert response.body == data.body(4)
    assert header(response, "Content-Range") is None


@pytest.mark.parametrize("value", ["bytes=1000-", "bytes=1000-1000", "bytes=5000-6000",
                                   "bytes=-0"])
def test_unsatisfiable_ranges_are_416(value: str) -> None:
    response = get(App(dataset()), "/get/" + NAME, range=value)
    assert response.status == 416
    assert header(response, "Content-Range") == "bytes */1000"
    assert response.body == b""


def test_ranges_on_an_empty_file() -> None:
    app = App(dataset(size="0"))
    assert get(app, "/get/" + NAME).status == 200
    for value in ("bytes=0-", "bytes=-5", "bytes=0-0"):
        response = get(app, "/get/" + NAME, range=value)
        assert response.status == 416, value
        assert header(response, "Content-Range") == "bytes */0"


def test_parse_range_directly() -> None:
    assert parse_range("bytes=0-9", 100) == (0, 10)
    assert parse_range("bytes=-1", 100) == (99, 100)
    assert parse_range("bytes=100-", 100) is False
    assert parse_range("bytes=9-0", 100) is None
    assert parse_range("bytes=0-9,20-29", 100) is None


def test_if_range() -> None:
    data = dataset()
    app = App(data)
    etag = header(get(app, "/get/" + NAME), "ETag")
    assert etag is not None
    matching = get(app, "/get/" + NAME, range="bytes=0-9", if_range=etag)
    assert matching.status == 206 and matching.body == data.body(4)[:10]
    for stale in ('"0123"', "W/" + etag, "*", f'"x", {etag}', "Wed, 01 Jan 2025 00:00:00 GMT"):
        response = get(app, "/get/" + NAME, range="bytes=0-9", if_range=stale)
        assert response.status == 200, stale
        assert response.body == data.body(4)
    # a stale If-Range also sidesteps a 416
    assert get(app, "/get/" + NAME, range="bytes=5000-", if_range='"0"').status == 200


# -- conditional requests -------------------------------------------------------------
@pytest.mark.parametrize(
    "template",
    ["{etag}", '"other", {etag}', "{etag}, \"other\"", "*", "W/{etag}", ' "a" ,  W/{etag} '],
)
def test_if_none_match_gives_304(template: str) -> None:
    app = App(dataset())
    etag = header(get(app, "/get/" + NAME), "ETag")
    response = get(app, "/get/" + NAME, if_none_match=template.format(etag=etag))
    assert response.status == 304
    assert response.body == b""
    assert header(response, "ETag") == etag
    assert header(response, "Last-Modified") == formatdate(EPOCH_2025, usegmt=True)


def test_if_none_match_mismatch_gives_200_and_wins_over_if_modified_since() -> None:
    app = App(dataset())
    response = get(app, "/get/" + NAME, if_none_match='"nope"',
                   if_modified_since=formatdate(EPOCH_2025 + 10, usegmt=True))
    assert response.status == 200 and len(response.body) == 1000


@pytest.mark.parametrize(
    ("stamp", "status"),
    [
        (formatdate(EPOCH_2025, usegmt=True), 304),
        (formatdate(EPOCH_2025 + 86400, usegmt=True), 304),
        (formatdate(EPOCH_2025 - 1, usegmt=True), 200),
        ("Tuesday, 31-Dec-24 23:59:59 GMT", 200),
        ("not a date", 200),
        ("", 200),
    ],
)
def test_if_modified_since(stamp: str, status: int) -> None:
    response = get(App(dataset()), "/get/" + NAME, if_modified_since=stamp)
    assert response.status == status
    assert len(response.body) == (0 if status == 304 else 1000)


def test_conditional_304_beats_range() -> None:
    app = App(dataset())
    etag = header(get(app, "/get/" + NAME), "ETag")
    assert get(app, "/get/" + NAME, if_none_match=etag, range="bytes=0-1").status == 304


# -- overlays ----------------------------------------------------------------------------
def test_hostile_names_on_the_first_page_and_served() -> None:
    inner = dataset(files=1500)
    app = App(HostileNames(inner))
    pages = walk(app)
    first = pages[0]["FileNames"]
    extra = first[1000:]
    assert first[:1000] == [inner.name(i) for i in range(1000)]
    assert extra[: len(TRAVERSAL_NAMES)] == list(TRAVERSAL_NAMES)
    assert "/etc/x" in extra and "../x" in extra and "" in extra
    assert set(COLLISION_NAMES) <= set(extra)
    assert "bad-utf8-\udcff" in extra  # survives JSON as an escaped lone surrogate
    assert extra[-1] == inner.name(1)  # a duplicate of a good name
    assert len(first) == 1000 + len(TRAVERSAL_NAMES) + len(MALFORMED_NAMES) + len(
        COLLISION_NAMES) + 1
    assert [len(p["FileNames"]) for p in pages[1:]] == [500]
    assert header(get(app, "/list"), "X-Total-Files") == str(1500 + len(extra))
    for name in ("../x", "/etc/x", "caf\u00e9", "cafe\u0301", "h/x/y", "trailing-space "):
        response = get(app, "/get/" + quote(name, safe=""))
        assert response.status == 200, name
        assert response.body == hostile_body(name)
    assert get(app, "/get/" + inner.name(1)).body == inner.body(1)
    # the hostile identity differs, so plain tokens are refused
    plain_token = json.loads(get(App(inner), "/list").body)["NextMarker"]
    assert get(app, "/list?next-marker=" + plain_token).status == 400


def bad_pages_app(kinds: set[str], files: int = 5000) -> tuple[App, SyntheticDataSet]:
    inner = dataset(files=files)
    return App(BadPages(inner, frozenset(kinds))), inner


def follow(app: App, token: str | None) -> Response:
    return get(app, "/list" if token is None else "/list?next-marker=" + token)


def test_bad_pages_empty_and_repeat() -> None:
    app, inner = bad_pages_app({"empty", "repeat"})
    page0 = json.loads(follow(app, None).body)
    empty = json.loads(follow(app, page0["NextMarker"]).body)
    assert empty["FileNames"] == [] and "NextMarker" in empty
    page1 = json.loads(follow(app, empty["NextMarker"]).body)
    assert page1["FileNames"][0] == inner.name(1000)
    again = json.loads(follow(app, page1["NextMarker"]).body)
    assert again["FileNames"] == page1["FileNames"]
    assert again["NextMarker"] != page1["NextMarker"]
    page2 = json.loads(follow(app, again["NextMarker"]).body)
    assert page2["FileNames"][0] == inner.name(2000)


def test_bad_pages_content_type_and_malformed() -> None:
    app, inner = bad_pages_app({"content-type", "malformed"})
    token = json.loads(follow(app, None).body)["NextMarker"]
    token = json.loads(follow(app, token).body)["NextMarker"]
    page2 = follow(app, token)
    assert page2.status == 200
    assert header(page2, "Content-Type") == "text/html"
    parsed = json.loads(page2.body)
    assert parsed["FileNames"][0] == inner.name(2000)
    page3 = follow(app, parsed["NextMarker"])
    assert page3.status == 200
    assert header(page3, "Content-Type") == "application/json"
    assert page3.body.startswith(b'{"FileNames":["f0000003000"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(page3.body)


@pytest.mark.parametrize("files", [5000, 2000])
def test_bad_pages_loop(files: int) -> None:
    app, inner = bad_pages_app({"loop"}, files=files)
    seen: list[str] = []
    token = None
    for _ in range(files // 1000 + 3):
        page = json.loads(follow(app, token).body)
        seen.append(page["FileNames"][0])
        token = page["NextMarker"]
    last = inner.pages - 1
    # ... -> last-1 -> last -> last-1 -> last ...
    assert seen[last - 1] == inner.name((last - 1) * 1000)
    assert seen[last] == inner.name(last * 1000)
    assert seen[last + 1] == seen[last - 1]
    assert seen[last + 2] == seen[last]


def test_bad_pages_on_hostile_names() -> None:
    inner = dataset(files=5000)
    app = App(BadPages(HostileNames(inner), frozenset({"content-type"})))
    first = json.loads(follow(app, None).body)
    assert "../x" in first["FileNames"]
    assert get(app, "/get/..%2Fx").body == hostile_body("../x")


# -- faults through the app -------------------------------------------------------------
def test_injected_faults_shape_the_response() -> None:
    data = dataset()
    fail = App(data, FaultPlan(FaultConfig(fail_rate=1.0), seed=0))
    statuses = {get(fail, f"/get/f{i:010d}").status for i in range(50)}
    assert statuses == {500, 503}
    throttle = App(data, FaultPlan(FaultConfig(throttle_rate=1.0, retry_after=7), seed=0))
    afters = {header(get(throttle, f"/get/f{i:010d}"), "Retry-After") for i in range(50)}
    assert "7" in afters and any(a and a.endswith("GMT") for a in afters)
    corrupt = App(data, FaultPlan(FaultConfig(corrupt_rate=1.0), seed=0))
    response = get(corrupt, "/get/" + NAME)
    assert response.status == 200 and len(response.body) == 1000
    assert response.body != data.body(4)
    assert header(response, "ETag") == '"' + hashlib.md5(data.body(4)).hexdigest() + '"'
    assert get(corrupt, "/list").body == get(App(data), "/list").body  # lists never corrupt
    truncate = App(data, FaultPlan(FaultConfig(truncate_rate=1.0), seed=0))
    assert get(truncate, "/get/" + NAME).fault is Fault.TRUNCATE
    assert get(truncate, "/get/nope").fault is Fault.NONE  # nothing to cut short
