"""Every fault switch of `bulkfetch serve`, observed by real HTTP clients over loopback.

Faults are deterministic in (seed, target, attempt), so every assertion below is stable:
a fixed seed always yields the same faults for the same request sequence.
"""

from __future__ import annotations

import io
import json
import selectors
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import BinaryIO

import pycurl
import pytest
from getkit import expected_body, md5_etag
from getkit import file_name as name

from bulkfetch.server.faults import Fault, FaultConfig, FaultPlan
from bulkfetch.testing import ReferenceServer

Start = Callable[..., ReferenceServer]


# -- raw HTTP/1.1 over a socket -------------------------------------------------------------
@dataclass
class Raw:
    status: int
    headers: dict[str, str]
    body: bytes


def read_response(stream: BinaryIO, head_only: bool = False) -> Raw:
    """One response from a buffered socket file; the body may come back short (truncation)."""
    status_line = stream.readline()
    if not status_line:
        raise EOFError("connection closed before a status line")
    version, status, _ = status_line.decode("latin-1").split(" ", 2)
    assert version == "HTTP/1.1"
    headers: dict[str, str] = {}
    while True:
        line = stream.readline()
        if line in (b"\r\n", b""):
            break
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = b"" if head_only else stream.read(length)
    return Raw(int(status), headers, body)


def request_bytes(target: str, method: str = "GET") -> bytes:
    return f"{method} {target} HTTP/1.1\r\nHost: test\r\n\r\n".encode()


def raw_get(port: int, target: str, timeout: float = 5.0) -> Raw:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request_bytes(target))
        with sock.makefile("rb") as stream:
            return read_response(stream)


def read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


# -- pycurl, many transfers at once ---------------------------------------------------------
@dataclass
class Result:
    error: int = 0  # libcurl error code, 0 on success
    status: int = 0  # 0: no HTTP response at all
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    seconds: float = 0.0


def curl_many(urls: list[str], timeout_ms: int = 5000) -> list[Result]:
    """Fetch all `urls` concurrently, one fresh connection each (so no libcurl auto-retry)."""
    multi = pycurl.CurlMulti()
    transfers = []
    for url in urls:
        handle = pycurl.Curl()
        body, header_lines = io.BytesIO(), []
        handle.setopt(pycurl.URL, url)
        handle.setopt(pycurl.WRITEDATA, body)
        handle.setopt(pycurl.HEADERFUNCTION, header_lines.append)
        handle.setopt(pycurl.TIMEOUT_MS, timeout_ms)
        handle.setopt(pycurl.FORBID_REUSE, 1)
        handle.setopt(pycurl.NOSIGNAL, 1)
        multi.add_handle(handle)
        transfers.append((handle, body, header_lines))
    errors: dict[int, int] = {}
    remaining = len(transfers)
    while remaining:
        while True:
            ret, _ = multi.perform()
            if ret != pycurl.E_CALL_MULTI_PERFORM:
                break
        while True:
            queued, done, failed = multi.info_read()
            for handle, code, _message in failed:
                errors[id(handle)] = code
            remaining -= len(done) + len(failed)
            if not queued:
                break
        if remaining:
            multi.select(0.05)
    results = []
    for handle, body, header_lines in transfers:
        headers = {}
        for line in header_lines:
            text = line.decode("latin-1")
            if text.startswith("HTTP/"):
                headers = {}
            key, sep, value = text.partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        results.append(Result(errors.get(id(handle), 0), handle.getinfo(pycurl.RESPONSE_CODE),
                              headers, body.getvalue(), handle.getinfo(pycurl.TOTAL_TIME)))
        multi.remove_handle(handle)
        handle.close()
    multi.close()
    return results


def curl_one(url: str, timeout_ms: int = 5000) -> Result:
    return curl_many([url], timeout_ms)[0]


def faults_by_target(server: ReferenceServer) -> dict[str, str]:
    rows = server.requests()
    counts = Counter(row.target for row in rows)
    assert max(counts.values()) == 1, "each target was asked for once"
    return {row.target: row.fault for row in rows}


# -- --fail-rate ----------------------------------------------------------------------------
def first_attempts(server: ReferenceServer, files: int) -> dict[str, int]:
    return {name(i): raw_get(server.port, f"/get/{name(i)}").status for i in range(files)}


def test_fail_rate_500_and_503_deterministic_and_retry_can_succeed(reference_server: Start):
    files = 60
    flags = ("--files", str(files), "--fail-rate", "0.5", "--seed", "7")
    server = reference_server(*flags, access_log=True)
    first = first_attempts(server, files)
    counts = Counter(first.values())
    assert set(counts) == {200, 500, 503}, counts
    assert 10 <= counts[500] + counts[503] <= 50, counts

    failed = [n for n, status in first.items() if status != 200]
    log = {row.target: row for row in server.requests()[:files]}
    for n, status in first.items():
        assert log[f"/get/{n}"].status == status
        assert log[f"/get/{n}"].fault == ("none" if status == 200 else "fail")

    # Determinism: a fresh server with the same seed fails the same first attempts, the
    # same way; another seed fails others.
    again = first_attempts(reference_server(*flags), files)
    assert again == first
    other = first_attempts(reference_server(*flags[:-1], "8"), files)
    assert other != first

    # Attempt-dependence: retrying each failed target eventually gets the right bytes.
    attempts_needed = []
    for n in failed:
        for attempt in range(2, 30):
            answer = raw_get(server.port, f"/get/{n}")
            if answer.status == 200:
                assert answer.body == expected_body(int(n[1:]), files, seed=7)
                assert answer.headers["etag"] == md5_etag(answer.body)
                attempts_needed.append(attempt)
                break
            assert answer.status in (500, 503)
            assert json.loads(answer.body)["error"]
        else:
            pytest.fail(f"{n} never succeeded")
    assert 2 in attempts_needed  # some target failed once, then succeeded on its retry


def test_attempts_are_counted_across_server_processes(reference_server: Start):
    """With --processes 2 a retry often reaches the other process; it is still the next
    attempt, so one target meets the plan's faults for attempts 0, 1, 2 ... in turn (with
    counts per process it would meet attempt 0's fault again)."""
    flags = ("--files", "10", "--fail-rate", "0.5", "--seed", "7")
    server = reference_server(*flags, processes=2, access_log=True)
    target = f"/get/{name(3)}"
    statuses = [raw_get(server.port, target).status for _ in range(40)]  # a connection each
    assert len({row.pid for row in server.requests()}) == 2, "both processes answered"
    plan = FaultPlan(FaultConfig(fail_rate=0.5), seed=7)
    expected = [plan.decide(target, True).fault for _ in range(40)]
    assert {Fault.FAIL, Fault.NONE} == set(expected)
    assert [status == 200 for status in statuses] == [f is Fault.NONE for f in expected]


# -- --throttle-rate ------------------------------------------------------------------------
def test_throttle_429_with_retry_after_in_both_forms(reference_server: Start):
    server = reference_server("--files", "40", "--throttle-rate", "1", "--retry-after", "3",
                              access_log=True)
    seconds, dates = 0, 0
    for i in range(40):
        answer = raw_get(server.port, f"/get/{name(i)}")
        now = time.time()
        assert answer.status == 429
        assert answer.headers["content-type"] == "application/json"
        assert json.loads(answer.body)["error"]
        value = answer.headers["retry-after"]
        if value.isdigit():
            assert int(value) == 3
            seconds += 1
        else:
            when = parsedate_to_datetime(value).timestamp()
            assert value.endswith(" GMT")
            assert now + 1 <= when <= now + 5, (value, now)  # ~3 s ahead, whole seconds
            dates += 1
    assert seconds >= 1 and dates >= 1, (seconds, dates)
    assert {row.fault for row in server.requests()} == {"throttle"}


# -- --latency ------------------------------------------------------------------------------
def timed_get(port: int, target: str) -> tuple[float, Raw]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(request_bytes(target))
        with sock.makefile("rb") as stream:
            answer = read_response(stream)
        return time.monotonic() - started, answer


@pytest.mark.parametrize("latency", ["200", "200-400"])
def test_latency_delays_every_answer(reference_server: Start, latency: str):
    server = reference_server("--files", "10", "--latency", latency)
    for target in ("/list", f"/get/{name(3)}", f"/get/{name(4)}"):
        seconds, answer = timed_get(server.port, target)
        assert answer.status == 200
        assert seconds >= 0.18, (target, seconds)
    assert answer.body == expected_body(4, 10)


def test_latency_does_not_serialise_connections(reference_server: Start):
    server = reference_server("--files", "10", "--latency", "600")
    started = time.monotonic()
    results = curl_many([f"{server.url}/get/{name(i)}" for i in range(8)])
    elapsed = time.monotonic() - started
    assert [r.status for r in results] == [200] * 8
    assert min(r.seconds for r in results) >= 0.58
    assert elapsed < 3.5  # one after another would take 4.8 s


# -- --truncate-rate ------------------------------------------------------------------------
def test_truncate_announces_length_sends_less_and_closes(reference_server: Start):
    server = reference_server("--files", "5", "--file-size", "1000", "--truncate-rate", "1",
                              access_log=True)
    true_body = expected_body(2, 5, size="1000")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request_bytes(f"/get/{name(2)}"))
        data = read_to_eof(sock)  # the server closes: recv returns b"" instead of timing out
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nContent-Length: 1000\r\n" in head
    assert 0 < len(body) < 1000
    assert true_body.startswith(body)

    result = curl_one(f"{server.url}/get/{name(3)}")
    assert result.error == pycurl.E_PARTIAL_FILE  # 18
    assert result.status == 200
    assert result.headers["content-length"] == "1000"
    assert len(result.body) < 1000

    # List pages have bodies too, so they are cut as well.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request_bytes("/list"))
        with sock.makefile("rb") as stream:
            page = read_response(stream)
    assert page.status == 200
    assert 0 < len(page.body) < int(page.headers["content-length"])
    assert {row.fault for row in server.requests()} == {"truncate"}


def test_truncate_of_a_streamed_body(reference_server: Start):
    server = reference_server("--files", "2", "--file-size", "1500000", "--truncate-rate", "1")
    result = curl_one(f"{server.url}/get/{name(1)}")
    assert result.error == pycurl.E_PARTIAL_FILE
    assert result.headers["content-length"] == "1500000"
    assert 0 < len(result.body) < 1500000


# -- --corrupt-rate -------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["100", "1500000"])  # generated whole / streamed in chunks
def test_corrupt_keeps_length_breaks_md5(reference_server: Start, size: str):
    files = 4
    bad = reference_server("--files", str(files), "--file-size", size, "--corrupt-rate", "1",
                           access_log=True)
    good = reference_server("--files", str(files), "--file-size", size, "--corrupt-rate", "0")
    for i in range(files):
        wrong = curl_one(f"{bad.url}/get/{name(i)}")
        right = curl_one(f"{good.url}/get/{name(i)}")
        for result in (wrong, right):
            assert result.error == 0 and result.status == 200
            assert len(result.body) == int(result.headers["content-length"]) == int(size)
        assert wrong.headers["etag"] == right.headers["etag"]
        assert md5_etag(right.body) == right.headers["etag"]
        assert right.body == expected_body(i, files, size=size)
        assert md5_etag(wrong.body) != wrong.headers["etag"]
        assert sum(a != b for a, b in zip(wrong.body, right.body, strict=True)) == 1
    # List pages are never corrupted.
    page = curl_one(f"{bad.url}/list")
    assert page.status == 200 and json.loads(page.body)["FileNames"][0] == name(0)
    faults = faults_by_target(bad)
    assert {faults[f"/get/{name(i)}"] for i in range(files)} == {"corrupt"}
    assert faults["/list"] == "none"


# -- --reset-rate ---------------------------------------------------------------------------
def test_reset_gives_connection_reset_and_no_response(reference_server: Start):
    server = reference_server("--files", "5", "--reset-rate", "1", access_log=True)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request_bytes(f"/get/{name(1)}"))
        with pytest.raises(ConnectionResetError):
            read_to_eof(sock)

    result = curl_one(f"{server.url}/get/{name(2)}")
    assert result.error in (pycurl.E_RECV_ERROR, pycurl.E_GOT_NOTHING)  # 56, 52
    assert result.status == 0 and result.body == b"" and result.headers == {}
    assert [row.fault for row in server.requests()] == ["reset", "reset"]


# -- --stall-rate ---------------------------------------------------------------------------
def test_stall_accepts_reads_and_never_answers(reference_server: Start):
    server = reference_server("--files", "5", "--stall-rate", "1", access_log=True)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request_bytes(f"/get/{name(1)}"))
        sock.settimeout(1.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)
    # The request was read and decided on: the server logged it.
    assert [(row.target, row.fault) for row in server.requests()] == [
        (f"/get/{name(1)}", "stall")
    ]


def faults_by_target_first(server: ReferenceServer, files: int) -> dict[int, str]:
    rows = server.requests()[:files]
    return {int(row.target.rsplit("/f", 1)[1]): row.fault for row in rows}


def test_stalled_connections_do_not_block_the_server(reference_server: Start):
    files = 20
    server = reference_server("--files", str(files), "--stall-rate", "0.5", access_log=True)
    selector = selectors.DefaultSelector()
    sockets = []
    for i in range(files):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(request_bytes(f"/get/{name(i)}"))
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, i)
        sockets.append(sock)
    try:
        answered: dict[int, bytes] = {}
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.1):
                chunk = key.fileobj.recv(65536)  # type: ignore[union-attr]
                answered[key.data] = answered.get(key.data, b"") + chunk
        stalled = set(range(files)) - set(answered)
        assert answered and stalled, (sorted(answered), sorted(stalled))
        for i, data in answered.items():
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            assert body == expected_body(i, files)
        # While those connections are still held open and silent, new ones get answers.
        fresh = curl_many([f"{server.url}/get/{name(i)}" for i in range(files)], 1000)
        assert sum(r.status == 200 for r in fresh) >= 3, [r.status for r in fresh]
    finally:
        selector.close()
        for sock in sockets:
            sock.close()
    logged = faults_by_target_first(server, files)
    assert {i for i, fault in logged.items() if fault == "stall"} == stalled


# -- all faults at once, each cross-checked against the access log ---------------------------
def classify(result: Result, files: int, index: int) -> str:
    if result.error == pycurl.E_OPERATION_TIMEDOUT and result.status == 0:
        return "stall"
    if result.error in (pycurl.E_RECV_ERROR, pycurl.E_GOT_NOTHING) and result.status == 0:
        return "reset"
    if result.error == pycurl.E_PARTIAL_FILE:
        return "truncate"
    assert result.error == 0, result
    if result.status in (500, 503):
        return "fail"
    if result.status == 429:
        assert "retry-after" in result.headers
        return "throttle"
    assert result.status == 200
    assert len(result.body) == int(result.headers["content-length"])
    if md5_etag(result.body) != result.headers["etag"]:
        return "corrupt"
    assert result.body == expected_body(index, files, seed=3)
    return "none"


def test_access_log_names_every_injected_fault(reference_server: Start):
    files = 120
    server = reference_server(
        "--files", str(files), "--seed", "3",
        "--stall-rate", "0.1", "--reset-rate", "0.1", "--fail-rate", "0.15",
        "--throttle-rate", "0.15", "--truncate-rate", "0.15", "--corrupt-rate", "0.15",
        access_log=True,
    )
    results = curl_many([f"{server.url}/get/{name(i)}" for i in range(files)], timeout_ms=1500)
    seen = [classify(result, files, i) for i, result in enumerate(results)]
    logged = faults_by_target(server)
    assert seen == [logged[f"/get/{name(i)}"] for i in range(files)]
    assert set(seen) == {"none", "stall", "reset", "fail", "throttle", "truncate", "corrupt"}
    statuses = {row.target: row.status for row in server.requests()}
    for i, fault in enumerate(seen):
        if fault in ("none", "fail", "throttle", "corrupt"):
            assert statuses[f"/get/{name(i)}"] == results[i].status


# -- keep-alive and pipelining --------------------------------------------------------------
def test_pipelined_requests_are_answered_in_order(reference_server: Start):
    files = 5
    server = reference_server("--files", str(files))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request_bytes(f"/get/{name(1)}") + request_bytes(f"/get/{name(2)}"))
        with sock.makefile("rb") as stream:
            first, second = read_response(stream), read_response(stream)
            assert (first.status, second.status) == (200, 200)
            assert first.body == expected_body(1, files)
            assert second.body == expected_body(2, files)
            # The connection stays open: a third request on it, HEAD then GET, is answered.
            sock.sendall(request_bytes(f"/get/{name(3)}", "HEAD") + request_bytes("/nope"))
            head = read_response(stream, head_only=True)
            assert head.status == 200 and head.headers["content-length"] == "100"
            assert read_response(stream).status == 404


def test_pipelined_answers_wait_for_delayed_ones(reference_server: Start):
    files = 6
    server = reference_server("--files", str(files), "--latency", "20-80")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"".join(request_bytes(f"/get/{name(i)}") for i in range(files)))
        with sock.makefile("rb") as stream:
            bodies = [read_response(stream).body for _ in range(files)]
    assert bodies == [expected_body(i, files) for i in range(files)]


def test_deep_pipeline_is_answered_completely(reference_server: Start):
    """Regression: answers sent from the request loop recursed once per pipelined request,
    so a few hundred requests in one read crashed the connection (RecursionError) and left
    the client hanging."""
    count = 3000
    server = reference_server("--files", "5")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request_bytes(f"/get/{name(4)}") * (count - 1)
                     + b"GET /list HTTP/1.1\r\nConnection: close\r\n\r\n")
        data = read_to_eof(sock)
    assert data.count(b"HTTP/1.1 200 OK\r\n") == count
    assert data.count(expected_body(4, 5)) == count - 1
    assert data.endswith(b'"FileNames":["f0000000000","f0000000001","f0000000002",'
                         b'"f0000000003","f0000000004"]}\n')
