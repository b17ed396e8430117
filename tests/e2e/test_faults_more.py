"""The hostile-server switches of `bulkfetch serve` on the wire: trickled, overlong, redirected,
denied and gzip-bombed answers, 503 with Retry-After, a huge first list page, and the access
log's auth and host columns. Raw sockets and http.client against a started server, like
test_faults.py; every fault is deterministic under --seed, so the assertions are stable."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import selectors
import socket
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path

import pycurl
import pytest
from getkit import expected_body, md5_etag
from getkit import file_name as name

from bulkfetch.server.app import OVERLONG_TAIL
from bulkfetch.testing import LoggedRequest, ReferenceServer

Start = Callable[..., ReferenceServer]
DENIED = {400, 401, 403, 404, 410}


# -- a raw exchange: every byte, when it came, and whether the server closed -----------------
@dataclass
class Exchange:
    status: int
    headers: dict[str, str]
    body: bytes  # everything after the head, also past Content-Length
    head_at: float  # seconds from sending the request to the end of the head
    body_times: list[float]  # arrival of each recv() of body bytes
    closed: bool  # the server closed the connection (EOF) within the deadline

    @property
    def length(self) -> int:
        return int(self.headers["content-length"])


def parse_head(data: bytes) -> tuple[int, dict[str, str]]:
    lines = data.decode("latin-1").split("\r\n")
    version, status, _ = lines[0].split(" ", 2)
    assert version == "HTTP/1.1"
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return int(status), headers


def request(target: str, host: str = "test", extra: str = "", close: bool = True) -> bytes:
    connection = "Connection: close\r\n" if close else ""
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}{connection}\r\n".encode()


def exchange_many(port: int, requests: list[bytes], deadline_s: float = 5.0) -> list[Exchange]:
    """Send each request on its own connection at once; read every answer until the server
    closes or the deadline passes."""
    selector = selectors.DefaultSelector()
    started = time.monotonic()
    state = []
    for i, raw in enumerate(requests):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(raw)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, i)
        state.append({"sock": sock, "data": b"", "times": [], "closed": False, "head_at": None,
                      "head_len": None})
    try:
        open_ = len(state)
        while open_ and time.monotonic() < started + deadline_s:
            for key, _ in selector.select(timeout=0.05):
                entry = state[key.data]
                chunk = entry["sock"].recv(65536)
                now = time.monotonic() - started
                if not chunk:
                    entry["closed"] = True
                    selector.unregister(entry["sock"])
                    open_ -= 1
                    continue
                entry["data"] += chunk
                if entry["head_len"] is None:
                    end = entry["data"].find(b"\r\n\r\n")
                    if end >= 0:
                        entry["head_len"], entry["head_at"] = end + 4, now
                        if len(entry["data"]) > end + 4:
                            entry["times"].append(now)
                else:
                    entry["times"].append(now)
    finally:
        selector.close()
        for entry in state:
            entry["sock"].close()
    out = []
    for entry in state:
        assert entry["head_len"] is not None, entry["data"][:200]
        status, headers = parse_head(entry["data"][: entry["head_len"] - 4])
        out.append(Exchange(status, headers, entry["data"][entry["head_len"]:],
                            entry["head_at"], entry["times"], entry["closed"]))
    return out


def exchange(port: int, raw: bytes, deadline_s: float = 5.0) -> Exchange:
    return exchange_many(port, [raw], deadline_s)[0]


def by_target(server: ReferenceServer) -> dict[str, LoggedRequest]:
    rows = server.requests()
    assert max(Counter(r.target for r in rows).values()) == 1
    return {r.target: r for r in rows}


def server_fds(server: ReferenceServer) -> int:
    assert server.process is not None
    return len(os.listdir(f"/proc/{server.process.pid}/fd"))


# -- --trickle-rate ---------------------------------------------------------------------------
def test_trickle_sends_the_head_at_once_then_one_byte_per_interval(reference_server: Start):
    files, size = 4, "8"
    server = reference_server("--files", str(files), "--file-size", size, "--trickle-rate", "1",
                              "--trickle-interval", "0.25", access_log=True)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(request(f"/get/{name(1)}", close=False))
        data, arrivals = b"", []
        while b"\r\n\r\n" not in data:
            data += sock.recv(4096)
        head_at = time.monotonic() - started
        head, _, body = data.partition(b"\r\n\r\n")
        status, headers = parse_head(head)
        while len(body) < 8:
            chunk = sock.recv(4096)
            assert chunk, "closed mid-trickle"
            arrivals.append((time.monotonic() - started, len(chunk)))
            body += chunk
        # Keep-alive survives a trickle: the next request on the connection is answered too.
        sock.sendall(request("/get/nope", close=False))
        assert sock.recv(4096).startswith(b"HTTP/1.1 404 ")
    assert status == 200 and headers["content-length"] == "8"
    assert headers["etag"] == md5_etag(expected_body(1, files, size=size))
    assert body == expected_body(1, files, size=size)
    assert head_at < 0.2, head_at  # the head is not trickled
    assert [n for _, n in arrivals] == [1] * 8, arrivals  # one byte per recv: spaced out
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(arrivals)]
    assert all(0.15 <= gap <= 1.0 for gap in gaps), gaps
    assert 1.6 <= arrivals[-1][0] <= 5, arrivals  # 8 bytes, 0.25 s apart
    assert [(r.target, r.fault) for r in server.requests()] == [
        (f"/get/{name(1)}", "trickle"), ("/get/nope", "none")]


def test_a_trickle_does_not_hold_up_other_connections(reference_server: Start):
    server = reference_server("--files", "3", "--file-size", "50", "--trickle-rate", "1",
                              "--trickle-interval", "0.2")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as slow:
        slow.sendall(request(f"/get/{name(0)}"))
        time.sleep(0.3)
        started = time.monotonic()
        for _ in range(5):  # no body, nothing to trickle: answered at once meanwhile
            answer = exchange(server.port, request("/get/nope"))
            assert answer.status == 404 and answer.closed
        assert time.monotonic() - started < 1.0
        head = slow.recv(4096)
        assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: 50\r\n" in head


def test_trickle_stops_when_the_client_goes_away(reference_server: Start):
    server = reference_server("--files", "2", "--file-size", "100000", "--trickle-rate", "1",
                              "--trickle-interval", "0.02")
    before = server_fds(server)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(request(f"/get/{name(1)}"))
    data = b""
    while data.count(b"\r\n\r\n") == 0 or len(data.partition(b"\r\n\r\n")[2]) < 3:
        data += sock.recv(4096)
    assert server_fds(server) == before + 1
    sock.close()
    deadline = time.monotonic() + 3
    while server_fds(server) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_fds(server) == before, "the server kept the trickled connection"
    # ... and keeps serving.
    assert exchange(server.port, request("/get/nope")).status == 404


# -- --overlong-rate --------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["100", "1500000"])  # whole body / streamed in chunks
def test_overlong_sends_garbage_past_content_length_then_closes(reference_server: Start,
                                                                size: str):
    files = 3
    server = reference_server("--files", str(files), "--file-size", size, "--overlong-rate",
                              "1", access_log=True)
    answer = exchange(server.port, request(f"/get/{name(2)}", close=False))
    true_body = expected_body(2, files, size=size)
    assert answer.status == 200 and answer.length == int(size)
    assert answer.headers["etag"] == md5_etag(true_body)
    assert answer.closed  # closed although the request asked for keep-alive
    assert len(OVERLONG_TAIL) == 64
    assert answer.body == true_body + OVERLONG_TAIL
    # A client that reads Content-Length bytes gets exactly the right ones.
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    connection.request("GET", f"/get/{name(1)}")
    response = connection.getresponse()
    assert response.read() == expected_body(1, files, size=size)
    connection.close()
    assert {r.fault for r in server.requests()} == {"overlong"}


# -- --redirect-rate / --redirect-to ----------------------------------------------------------
def test_redirect_kinds_and_what_follows_them(reference_server: Start):
    files = 4
    servers = {kind: reference_server("--files", str(files), "--redirect-rate", "1",
                                      "--redirect-to", kind, access_log=True)
               for kind in ("other-host", "file", "loop", "relative")}
    target = f"/get/{name(2)}"
    right = expected_body(2, files)

    server = servers["other-host"]
    moved = exchange(server.port, request(target))
    assert moved.status == 302 and moved.headers["location"] == (
        f"http://localhost:{server.port}{target}")
    followed = exchange(server.port, request(target, host=f"localhost:{server.port}"))
    assert followed.status == 200 and followed.body == right

    server = servers["file"]
    moved = exchange(server.port, request(target))
    assert moved.status == 302 and moved.headers["location"] == "file:///etc/passwd"
    assert exchange(server.port, request(target, host=f"localhost:{server.port}")).status == 200

    server = servers["relative"]
    moved = exchange(server.port, request(target))
    assert moved.status == 302 and moved.headers["location"] == target + "?redirected=1"
    followed = exchange(server.port, request(target + "?redirected=1"))
    assert followed.status == 200 and followed.body == right
    assert exchange(server.port, request("/list")).status == 200  # list pages: never

    server = servers["loop"]
    for host in ("test", f"localhost:{server.port}", "test"):  # for ever, whatever the host
        moved = exchange(server.port, request(target, host=host))
        assert moved.status == 302 and moved.headers["location"] == target
    assert [r.fault for r in server.requests()] == ["redirect"] * 3
    assert [r.status for r in servers["other-host"].requests()] == [302, 200]
    assert [r.fault for r in servers["relative"].requests()] == ["redirect", "none", "none"]


def curl_follow(url: str, headers: list[str] | None = None) -> tuple[int, int, bytes, int]:
    """libcurl following redirects: (error, status, body, redirects followed)."""
    handle = pycurl.Curl()
    body = bytearray()
    handle.setopt(pycurl.URL, url)
    handle.setopt(pycurl.WRITEFUNCTION, body.extend)
    handle.setopt(pycurl.FOLLOWLOCATION, 1)
    handle.setopt(pycurl.MAXREDIRS, 5)
    handle.setopt(pycurl.TIMEOUT, 10)
    handle.setopt(pycurl.NOSIGNAL, 1)
    handle.setopt(pycurl.HTTPHEADER, headers or [])
    try:
        handle.perform()
        error = 0
    except pycurl.error as exc:
        error = exc.args[0]
    result = (error, handle.getinfo(pycurl.RESPONSE_CODE), bytes(body),
              handle.getinfo(pycurl.REDIRECT_COUNT))
    handle.close()
    return result


def test_all_redirect_kinds_under_libcurl(reference_server: Start):
    files = 40
    server = reference_server("--files", str(files), "--seed", "5", "--redirect-rate", "1",
                              access_log=True)
    outcomes: Counter[str] = Counter()
    for i in range(files):
        error, status, body, hops = curl_follow(f"{server.url}/get/{name(i)}")
        if error == 0:  # other-host or relative: one hop, then the right bytes
            assert (status, hops) == (200, 1) and body == expected_body(i, files, seed=5)
            outcomes["followed"] += 1
        elif error == pycurl.E_TOO_MANY_REDIRECTS:  # loop
            assert hops == 5
            outcomes["loop"] += 1
        else:  # file: libcurl does not follow to file:// (and must not)
            assert error == pycurl.E_UNSUPPORTED_PROTOCOL, (error, status)
            outcomes["file"] += 1
    assert set(outcomes) == {"followed", "loop", "file"}, outcomes
    rows = server.requests()
    first = {r.target: r.status for r in rows if r.host == f"127.0.0.1:{server.port}"
             and "redirected" not in r.target}
    assert set(first.values()) == {302}
    hosts = {r.host for r in rows}
    assert hosts == {f"127.0.0.1:{server.port}", f"localhost:{server.port}"}
    assert {r.target.partition("?")[2] for r in rows} == {"", "redirected=1"}
    # Same seed, same redirects: a fresh server sends the first attempts the same places.
    twins = [reference_server("--files", str(files), "--seed", "5", "--redirect-rate", "1")
             for _ in range(2)]
    places = [[exchange(twin.port, request(f"/get/{name(i)}")).headers["location"]
               .replace(str(twin.port), "PORT") for i in range(files)] for twin in twins]
    assert places[0] == places[1]
    kinds = Counter(redirect_kind(place, f"/get/{name(i)}") for i, place in enumerate(places[0]))
    assert set(kinds) == {"other-host", "file", "loop", "relative"}, kinds


def redirect_kind(location: str, target: str) -> str:
    if location == "file:///etc/passwd":
        return "file"
    if location == target:
        return "loop"
    if location == target + "?redirected=1":
        return "relative"
    assert location == "http://localhost:PORT" + target, location
    return "other-host"


# -- the access log's auth and host columns ---------------------------------------------------
def test_access_log_says_whether_credentials_were_sent_and_to_which_host(
        reference_server: Start):
    server = reference_server("--files", "5", "--redirect-rate", "1", "--redirect-to",
                              "other-host", access_log=True)
    target = f"/get/{name(1)}"
    # A client that follows with the credentials (the leak a client test must catch) ...
    exchange(server.port, request(target, host=f"127.0.0.1:{server.port}",
                                  extra="Authorization: Basic YWxpY2U6czNjcjN0\r\n"))
    exchange(server.port, request(target, host=f"localhost:{server.port}",
                                  extra="Authorization: Basic YWxpY2U6czNjcjN0\r\n"))
    # ... one that drops them, and odd Host headers.
    exchange(server.port, request(target, host=f"localhost:{server.port}"))
    exchange(server.port, request(target, host="a b%c\x01"))
    exchange(server.port, b"GET /list HTTP/1.0\r\n\r\n")  # list pages: never redirected
    exchange(server.port, request("/list?again", host="-"))
    rows = server.requests()
    assert [(r.auth, r.host, r.status) for r in rows] == [
        (True, f"127.0.0.1:{server.port}", 302),
        (True, f"localhost:{server.port}", 200),
        (False, f"localhost:{server.port}", 200),
        (False, "a b%c\x01", 302),
        (False, "", 200),
        (False, "-", 200),
    ]
    assert server.log_path is not None
    text = server.log_path.read_text()
    assert "YWxpY2U6czNjcjN0" not in text  # never the credentials themselves
    lines = text.splitlines()
    assert all(len(line.split(" ")) == 9 for line in lines)
    assert lines[0].endswith(f" redirect yes 127.0.0.1:{server.port}")
    assert lines[3].endswith(" redirect no a%20b%25c%01")
    assert lines[4].endswith(" none no -") and lines[5].endswith(" none no %2D")


def test_logged_request_parses_old_and_new_lines():
    old = LoggedRequest.parse("1.5 7 GET /get/x 200 100 none")
    assert (old.target, old.fault, old.auth, old.host) == ("/get/x", "none", False, "")
    new = LoggedRequest.parse("1.5 7 GET /get/x 302 30 redirect yes localhost:80")
    assert (new.status, new.auth, new.host) == (302, True, "localhost:80")
    with pytest.raises(ValueError):
        LoggedRequest.parse("1.5 7 GET /get/x 200 100 none yes")


# -- --deny-rate ------------------------------------------------------------------------------
def test_deny_answers_a_name_the_same_permanent_error_every_time(reference_server: Start):
    files = 100
    server = reference_server("--files", str(files), "--seed", "2", "--deny-rate", "0.3",
                              "--fail-rate", "1", access_log=True)  # deny is not in the sum
    first = exchange_many(server.port, [request(f"/get/{name(i)}") for i in range(files)])
    denied = {i: e.status for i, e in enumerate(first) if e.status in DENIED}
    assert set(denied.values()) == DENIED, Counter(denied.values())
    assert 15 <= len(denied) <= 45, len(denied)
    assert {e.status for i, e in enumerate(first) if i not in denied} <= {500, 503}
    for i, status in denied.items():
        assert json.loads(first[i].body)["error"]
        assert ("www-authenticate" in first[i].headers) == (status == 401)
    for _ in range(2):  # retries: the very same answers, unlike the per-attempt faults
        again = exchange_many(server.port, [request(f"/get/{name(i)}") for i in denied])
        assert [e.status for e in again] == list(denied.values())
    log = [r for r in server.requests()]
    assert {r.fault for r in log if r.status in DENIED} == {"deny"}
    assert {r.fault for r in log if r.status not in DENIED} == {"fail"}
    # The seed picks the names; a fresh server with the same seed picks the same ones.
    same = reference_server("--files", str(files), "--seed", "2", "--deny-rate", "0.3")
    answers = exchange_many(same.port, [request(f"/get/{name(i)}") for i in range(files)])
    assert {i: e.status for i, e in enumerate(answers) if e.status in DENIED} == denied
    assert all(e.body == expected_body(i, files, seed=2)
               for i, e in enumerate(answers) if i not in denied)


# -- --encoding-rate --------------------------------------------------------------------------
def test_encoding_sends_a_small_chained_gzip_bomb(reference_server: Start):
    server = reference_server("--files", "3", "--encoding-rate", "1", access_log=True)
    answers = exchange_many(server.port, [request(f"/get/{name(i)}") for i in range(3)])
    bomb = answers[0].body
    for answer in answers:
        assert answer.status == 200 and answer.closed
        assert answer.headers["content-encoding"] == "gzip, gzip"
        assert answer.length == len(answer.body) == len(bomb) < 8192  # a few KiB sent
        assert answer.headers["etag"] == md5_etag(answer.body)
        assert answer.body == bomb  # built once, served alike
    inner = zlib.decompress(bomb, 31)  # first layer: ~1 MiB, another gzip stream
    assert inner[:2] == b"\x1f\x8b"
    decoder, decoded, position = zlib.decompressobj(31), 0, 0
    while position < len(inner):  # second layer, decoded in bounded pieces: 1 GiB of zeros
        piece = decoder.decompress(inner[position : position + 16384], 1 << 24)
        position += 16384
        while True:
            assert not (piece[:4096] + piece[-4096:]).strip(b"\0")  # zeros (sampled)
            decoded += len(piece)
            if not decoder.unconsumed_tail:
                break
            piece = decoder.decompress(decoder.unconsumed_tail, 1 << 24)
    assert decoder.eof and decoded == 1 << 30
    # List pages and HEAD are left alone.
    page = exchange(server.port, request("/list"))
    assert "content-encoding" not in page.headers and json.loads(page.body)["FileNames"]
    assert [r.fault for r in server.requests()] == ["encoding"] * 3 + ["none"]


# -- 503 with Retry-After; absurd Retry-After -------------------------------------------------
def test_every_503_has_retry_after_in_seconds_or_date_form(reference_server: Start):
    files = 80
    server = reference_server("--files", str(files), "--fail-rate", "1", "--retry-after", "4")
    answers = exchange_many(server.port, [request(f"/get/{name(i)}") for i in range(files)])
    now = time.time()
    forms = Counter()
    for answer in answers:
        if answer.status == 500:
            assert "retry-after" not in answer.headers
            forms["500"] += 1
            continue
        assert answer.status == 503
        value = answer.headers["retry-after"]
        if value.isdigit():
            assert value == "4"
            forms["seconds"] += 1
        else:
            assert value.endswith(" GMT")
            assert now + 1 <= parsedate_to_datetime(value).timestamp() <= now + 7
            forms["date"] += 1
    assert min(forms["500"], forms["seconds"], forms["date"]) >= 5, forms


@pytest.mark.parametrize("flag", ["--throttle-rate", "--fail-rate"])
def test_retry_after_can_be_absurdly_large(reference_server: Start, flag: str):
    files = 60
    server = reference_server("--files", str(files), flag, "1", "--retry-after", "1000000000")
    answers = exchange_many(server.port, [request(f"/get/{name(i)}") for i in range(files)])
    values = [a.headers["retry-after"] for a in answers if a.status in (429, 503)]
    assert "1000000000" in values
    dates = [parsedate_to_datetime(v).timestamp() for v in values if not v.isdigit()]
    assert dates and all(abs(d - (time.time() + 1e9)) < 60 for d in dates)  # year 2057
    huge = reference_server("--files", "40", "--throttle-rate", "1", "--retry-after",
                            str(10**20))
    values = {exchange(huge.port, request(f"/get/{name(i)}")).headers["retry-after"]
              for i in range(40)}
    assert values == {str(10**20), "Fri, 31 Dec 9999 23:59:59 GMT"}


# -- --huge-page ------------------------------------------------------------------------------
def peak_rss_kib(server: ReferenceServer) -> int:
    assert server.process is not None
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmHWM:")))


def test_huge_first_page_is_streamed_and_pagination_goes_on(reference_server: Start):
    files, huge, page_size = 400_000, 350_000, 20_000
    server = reference_server("--files", str(files), "--page-size", str(page_size),
                              "--huge-page", str(huge), start_timeout=30)
    exchange(server.port, request("/get/nope"))
    rss_before = peak_rss_kib(server)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", "/list")
    response = connection.getresponse()
    length = int(response.getheader("Content-Length"))
    body = response.read()
    assert response.status == 200 and len(body) == length > 350_000 * 13
    first = json.loads(body)
    assert first["FileNames"] == [name(i) for i in range(huge)]
    rss_growth = peak_rss_kib(server) - rss_before
    # Built whole, the page would take tens of MB (350,000 str objects and ~5 MB of JSON,
    # twice); streamed in ~60 KB chunks it takes next to nothing.
    assert rss_growth < 12_000, f"peak RSS grew by {rss_growth} KiB"
    listed = list(first["FileNames"])
    token = first.get("NextMarker")
    while token:
        connection.request("GET", f"/list?next-marker={token}")
        page = json.loads(connection.getresponse().read())
        assert len(page["FileNames"]) <= page_size
        listed += page["FileNames"]
        token = page.get("NextMarker")
    connection.close()
    assert listed == [name(i) for i in range(files)]  # no gap, no repeat
    assert len(listed) == files


def test_huge_page_head_and_cap(reference_server: Start):
    server = reference_server("--files", "30", "--page-size", "7", "--huge-page", "1000")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    connection.request("GET", "/list")
    response = connection.getresponse()
    page = json.loads(response.read())
    assert page["FileNames"] == [name(i) for i in range(30)] and "NextMarker" not in page
    connection.request("HEAD", "/list")
    head = connection.getresponse()
    assert head.getheader("Content-Length") == response.getheader("Content-Length")
    assert head.read() == b""
    connection.close()
    assert "a first page of 30" in server.banner


# -- all the new faults at once, each cross-checked against the access log -------------------
def classify(answer: Exchange, index: int, files: int) -> str:
    if answer.status == 302:
        return "redirect"
    if answer.status in DENIED:
        return "deny"
    assert answer.status == 200, answer
    if answer.headers.get("content-encoding") == "gzip, gzip":
        return "encoding"
    right = expected_body(index, files, seed=11, size="10")
    if len(answer.body) > answer.length:
        assert answer.body == right + OVERLONG_TAIL
        return "overlong"
    assert answer.body == right
    span = answer.body_times[-1] - answer.head_at
    if span >= 0.5:  # 10 bytes 0.1 s apart: ~0.9 s
        assert len(answer.body_times) >= 5
        return "trickle"
    return "none"


def test_access_log_names_every_new_fault(reference_server: Start):
    files = 120
    server = reference_server(
        "--files", str(files), "--seed", "11", "--file-size", "10",
        "--trickle-rate", "0.15", "--trickle-interval", "0.1", "--overlong-rate", "0.15",
        "--redirect-rate", "0.15", "--encoding-rate", "0.15", "--deny-rate", "0.1",
        access_log=True,
    )
    answers = exchange_many(server.port, [request(f"/get/{name(i)}") for i in range(files)],
                            deadline_s=8)
    seen = [classify(answer, i, files) for i, answer in enumerate(answers)]
    logged = by_target(server)
    assert seen == [logged[f"/get/{name(i)}"].fault for i in range(files)]
    assert set(seen) == {"none", "trickle", "overlong", "redirect", "encoding", "deny"}
    assert all(a.closed for a in answers)


# -- the switches are documented, validated, and refused by --export-static -----------------
NEW_SWITCHES = ("--trickle-rate", "--trickle-interval", "--overlong-rate", "--redirect-rate",
                "--redirect-to", "--deny-rate", "--encoding-rate", "--huge-page")


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bulkfetch", "serve", *args],
                          capture_output=True, text=True, timeout=60)


def test_help_documents_every_new_switch():
    done = serve("--help")
    assert done.returncode == 0
    for switch in NEW_SWITCHES:
        assert switch in done.stdout, switch
    for kind in ("other-host", "file", "loop", "relative"):
        assert kind in done.stdout


@pytest.mark.parametrize("flags, message", [
    (("--trickle-rate", "0.6", "--overlong-rate", "0.5"), "more than 1"),
    (("--redirect-rate", "0.5", "--encoding-rate", "0.6"), "more than 1"),
    (("--deny-rate", "1.5"), "--deny-rate"),
    (("--redirect-to", "ftp"), "--redirect-to"),
    (("--trickle-interval", "0"), "--trickle-interval"),
    (("--huge-page", "0"), "--huge-page"),
    (("--huge-page", "5", "--hostile-names"), "--huge-page"),
])
def test_bad_switches_are_usage_errors(flags: tuple[str, ...], message: str):
    done = serve("--port", "0", *flags)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("flags", [
    ("--trickle-rate", "0.1"), ("--overlong-rate", "0.1"), ("--redirect-rate", "0.1"),
    ("--deny-rate", "0.1"), ("--encoding-rate", "0.1"), ("--huge-page", "5"),
])
def test_export_static_refuses_the_new_switches(flags: tuple[str, ...], tmp_path: Path):
    done = serve("--files", "10", "--export-static", str(tmp_path / "export"), *flags)
    assert done.returncode == 2, done.stderr
    assert "--export-static" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "export").exists()
