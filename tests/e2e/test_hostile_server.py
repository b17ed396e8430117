"""The hostile overlays of `bulkfetch serve` (--hostile-names, --bad-pages) and its answers to
forged tokens and unknown names, observed over loopback with a real HTTP client."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import pytest

from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.server.hostile import (
    COLLISION_NAMES,
    MALFORMED_NAMES,
    TRAVERSAL_NAMES,
    hostile_body,
)
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.sizes import parse_size_spec

Start = Callable[..., ReferenceServer]
GOOD = re.compile(r"f\d{10}")
HOSTILE = (*TRAVERSAL_NAMES, *MALFORMED_NAMES, *COLLISION_NAMES)
SURROGATE = "bad-utf8-\udcff"


def name(index: int) -> str:
    return f"f{index:010d}"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


class Client:
    """One keep-alive connection; targets go on the wire exactly as given."""

    def __init__(self, server: ReferenceServer) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)

    def get(self, target: str) -> Answer:
        self.conn.request("GET", target)
        response = self.conn.getresponse()
        body = response.read()
        headers = {k.lower(): v for k, v in response.getheaders()}
        assert int(headers["content-length"]) == len(body)
        return Answer(response.status, headers, body)

    def page(self, token: str | None = None) -> Answer:
        return self.get("/list" if token is None else "/list?next-marker=" + quote(token))

    def close(self) -> None:
        self.conn.close()


def walk(client: Client, limit: int = 50) -> tuple[list[tuple[str | None, Answer]], str]:
    """Follow NextMarker from the first page; stop at the end, a page that is not JSON, or
    a token seen before. Returns [(token used, answer)] and why the walk stopped."""
    pages: list[tuple[str | None, Answer]] = []
    token: str | None = None
    seen: set[str | None] = set()
    while len(pages) < limit:
        answer = client.page(token)
        assert answer.status == 200, (token, answer)
        pages.append((token, answer))
        seen.add(token)
        try:
            token = answer.json().get("NextMarker")
        except json.JSONDecodeError:
            return pages, "malformed"
        if token is None:
            return pages, "end"
        if token in seen:
            return pages, "loop"
    return pages, "limit"


def good_names(first: int, stop: int) -> list[str]:
    return [name(i) for i in range(first, stop)]


# -- --hostile-names ------------------------------------------------------------------------
def test_first_page_lists_every_hostile_name(reference_server: Start):
    files, page_size = 25, 10
    server = reference_server("--files", str(files), "--page-size", str(page_size),
                              "--hostile-names")
    client = Client(server)
    pages, stop = walk(client)
    assert stop == "end" and len(pages) == 3
    first = pages[0][1]
    assert first.headers["content-type"] == "application/json"
    names = first.json()["FileNames"]
    for hostile in HOSTILE:
        assert names.count(hostile) == 1, repr(hostile)
    # JSON has no UTF-8 for a lone surrogate: it travels as an escape, and the page is ASCII.
    assert b'"bad-utf8-\\udcff"' in first.body
    assert first.body.isascii()
    assert b'"nul\\u0000byte"' in first.body
    assert names.count(name(1)) == 2  # the duplicate of good file 1
    assert names[:page_size] == good_names(0, page_size)

    listed = [n for _, answer in pages for n in answer.json()["FileNames"]]
    good = [n for n in listed if GOOD.fullmatch(n)]
    assert len(set(good)) == files and set(good) == set(good_names(0, files))
    assert len(listed) == files + len(HOSTILE) + 1
    for _, answer in pages:
        assert answer.headers["x-total-files"] == str(len(listed))
    for _, answer in pages[1:]:  # hostile names come only on the first page
        assert not set(answer.json()["FileNames"]) & set(HOSTILE)


def test_hostile_names_are_served_with_their_own_bodies(reference_server: Start):
    files = 10
    server = reference_server("--files", str(files), "--hostile-names")
    client = Client(server)
    served = 0
    for hostile in HOSTILE:
        if hostile == SURROGATE:
            continue
        answer = client.get("/get/" + quote(hostile, safe=""))
        assert answer.status == 200, repr(hostile)
        assert answer.body == hostile_body(hostile), repr(hostile)
        assert answer.headers["etag"] == '"' + hashlib.md5(answer.body).hexdigest() + '"'
        served += 1
    assert served == len(HOSTILE) - 1
    # Spot checks of the encodings a client must use; NFC and NFD spellings differ.
    assert client.get("/get/..%2Fx").body == hostile_body("../x")
    assert client.get("/get/C%3Ax").body == hostile_body("C:x")
    assert client.get("/get/nul%00byte").body == hostile_body("nul\x00byte")
    assert hostile_body("caf\u00e9") != hostile_body("cafe\u0301")
    # A lone surrogate has no UTF-8 spelling, so it cannot be asked for.
    encoded = quote(SURROGATE.encode("utf-8", "surrogateescape"), safe="")
    assert client.get("/get/" + encoded).status == 404
    # The duplicated good name is the good file, not a hostile body.
    dataset = SyntheticDataSet(files, 1000, 0, parse_size_spec("100"))
    assert client.get("/get/" + name(1)).body == dataset.body(1)


# -- --bad-pages ----------------------------------------------------------------------------
def names_of(answer: Answer) -> list[str]:
    return answer.json()["FileNames"]


def start_bad(reference_server: Start, kinds: str | None, files: int = 1000,
              *extra: str) -> Client:
    flags = ["--files", str(files), "--page-size", "100", *extra, "--bad-pages"]
    if kinds is not None:
        flags.append(kinds)
    return Client(reference_server(*flags))


def check_plain_pages(pages: list[tuple[str | None, Answer]], first_page: int) -> None:
    for offset, (_, answer) in enumerate(pages):
        number = first_page + offset
        assert answer.headers["content-type"] == "application/json"
        assert names_of(answer) == good_names(number * 100, number * 100 + 100)


def test_bad_pages_with_no_value_means_all(reference_server: Start):
    client = start_bad(reference_server, None)
    pages, stop = walk(client)
    assert stop == "malformed"
    answers = [answer for _, answer in pages]
    tokens = [token for token, _ in pages]
    assert len(pages) == 6
    assert names_of(answers[0]) == good_names(0, 100)
    assert answers[1].json() == {"FileNames": [], "NextMarker": answers[1].json()["NextMarker"]}
    assert names_of(answers[2]) == names_of(answers[3]) == good_names(100, 200)
    assert tokens[2] != tokens[3]
    assert answers[4].headers["content-type"] == "text/html"
    assert names_of(answers[4]) == good_names(200, 300)
    assert answers[5].status == 200
    assert answers[5].headers["content-type"] == "application/json"
    assert answers[5].body.startswith(b'{"FileNames":["f0000000300"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(answers[5].body)
    # The listing was not otherwise broken: all other pages are plain JSON.
    for answer in (answers[0], answers[2], answers[3]):
        assert answer.headers["content-type"] == "application/json"


def test_bad_pages_empty(reference_server: Start):
    pages, stop = walk(start_bad(reference_server, "empty"))
    assert stop == "end" and len(pages) == 11
    empty = pages[1][1].json()
    assert empty["FileNames"] == [] and empty["NextMarker"]
    check_plain_pages(pages[:1], 0)
    check_plain_pages(pages[2:], 1)


def test_bad_pages_repeat(reference_server: Start):
    pages, stop = walk(start_bad(reference_server, "repeat"))
    assert stop == "end" and len(pages) == 11
    (token_a, first), (token_b, again) = pages[1], pages[2]
    assert token_a != token_b
    assert names_of(first) == names_of(again) == good_names(100, 200)
    check_plain_pages(pages[:2], 0)
    check_plain_pages(pages[3:], 2)
    listed = [n for _, answer in pages for n in names_of(answer)]
    assert len(listed) == 1100 and len(set(listed)) == 1000


def test_bad_pages_content_type(reference_server: Start):
    pages, stop = walk(start_bad(reference_server, "content-type"))
    assert stop == "end" and len(pages) == 10
    types = [answer.headers["content-type"] for _, answer in pages]
    assert types == ["application/json"] * 2 + ["text/html"] + ["application/json"] * 7
    assert [n for _, answer in pages for n in names_of(answer)] == good_names(0, 1000)


def test_bad_pages_malformed(reference_server: Start):
    client = start_bad(reference_server, "malformed")
    pages, stop = walk(client)
    assert stop == "malformed" and len(pages) == 4
    check_plain_pages(pages[:3], 0)
    bad = pages[3][1]
    assert bad.status == 200 and bad.headers["content-type"] == "application/json"
    assert bad.body.startswith(b'{"FileNames":["f0000000300"')
    # Asking again gives the same broken bytes: it is not a transient fault.
    assert client.page(pages[3][0]).body == bad.body


def test_bad_pages_loop(reference_server: Start):
    client = start_bad(reference_server, "loop")
    pages, stop = walk(client)
    assert stop == "loop" and len(pages) == 10
    check_plain_pages(pages, 0)
    token_a, page_a = pages[8]  # A: the page before the last
    token_b, page_b = pages[9]  # B: the last page
    assert page_b.json()["NextMarker"] == token_a  # B -> A
    back = client.page(token_a)
    assert back.body == page_a.body and back.json()["NextMarker"] == token_b  # A -> B again


def test_bad_pages_loop_back_to_the_first_page(reference_server: Start):
    """Regression: with two pages the loop token points at page 0, which was refused (400)."""
    client = start_bad(reference_server, "loop", 200, "--hostile-names")
    pages, stop = walk(client)
    assert stop == "loop" and len(pages) == 3
    (_, page_a), (token_b, page_b), (token_back, back) = pages
    assert token_back == page_b.json()["NextMarker"]
    assert back.body == page_a.body  # page 0 again (under a new token), hostile names included
    assert SURROGATE in names_of(back)
    assert back.json()["NextMarker"] == token_b  # A -> B -> A -> B


def test_bad_pages_kinds_combine(reference_server: Start):
    pages, stop = walk(start_bad(reference_server, "empty,repeat,content-type,loop"))
    assert stop == "loop"
    assert len(pages) == 12  # 10 pages + the empty one + the repeat
    assert names_of(pages[1][1]) == []
    assert names_of(pages[2][1]) == names_of(pages[3][1])
    assert pages[4][1].headers["content-type"] == "text/html"
    assert pages[11][1].json()["NextMarker"] == pages[10][0]


# -- tokens and names the server never issued -----------------------------------------------
BAD_TOKEN = {"error": "invalid or forged next-marker token"}


def test_forged_and_foreign_tokens_are_refused(reference_server: Start):
    flags = ("--files", "300", "--page-size", "100")
    server = reference_server(*flags, "--seed", "0")
    client = Client(server)
    token = client.page().json()["NextMarker"]
    assert names_of(client.page(token)) == good_names(100, 200)

    # Stable across restarts: the same data set on a fresh server accepts the token.
    same = Client(reference_server(*flags, "--seed", "0"))
    assert names_of(same.page(token)) == good_names(100, 200)

    forged = [
        "AAAAAAAAAAEAAAAAAAAAAAAA",  # page 1 with a zero MAC
        token[:-1] + ("A" if token[-1] != "A" else "B"),  # one character changed
        token + "AA",
        "not a token",
        "%FF%FE",
    ]
    for bad in forged:
        answer = client.get("/list?next-marker=" + quote(bad))
        assert answer.status == 400, bad
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == BAD_TOKEN
    assert client.get("/list?next-marker=").status == 400

    other = Client(reference_server(*flags, "--seed", "1"))
    foreign = other.page().json()["NextMarker"]
    assert foreign != token
    answer = client.page(foreign)
    assert answer.status == 400 and answer.json() == BAD_TOKEN
    # A plain token is foreign to the same files with broken pagination, and vice versa.
    bad = start_bad(reference_server, "loop", 300)
    assert bad.page(token).status == 400
    assert client.page(bad.page().json()["NextMarker"]).status == 400


def test_unknown_names_and_paths_are_404(reference_server: Start):
    client = Client(reference_server("--files", "10", "--hostile-names"))
    for target in ("/get/f0000000010", "/get/f9999999999", "/get/nope", "/get/x/../f0000000001",
                   "/get/%2E%2E%2Fy", "/get/%FF", "/nope", "/"):
        answer = client.get(target)
        assert answer.status == 404, target
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {"error": "no such file"}
    assert client.get("/get/f0000000009").status == 200
