"""`bulkfetch serve` for big-file clients, over loopback with libcurl (pycurl): bandwidth per
connection, Repr-Digest, and the range faults on the wire."""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field

import pycurl
import pytest

MIB = 1 << 20
NAME = "f0000000000"


@dataclass
class Transfer:
    url: str
    range: str | None = None
    headers: list[str] = field(default_factory=list)  # extra request headers
    body: io.BytesIO = field(default_factory=io.BytesIO)
    head: dict[str, str] = field(default_factory=dict)
    status: int = 0
    curl: pycurl.Curl = field(default_factory=pycurl.Curl)

    def __post_init__(self) -> None:
        c = self.curl
        c.setopt(pycurl.URL, self.url)
        c.setopt(pycurl.WRITEDATA, self.body)
        c.setopt(pycurl.HEADERFUNCTION, self._header)
        c.setopt(pycurl.TIMEOUT, 30)
        c.setopt(pycurl.FORBID_REUSE, 1)  # every transfer its own connection
        if self.range is not None:
            c.setopt(pycurl.RANGE, self.range)
        if self.headers:
            c.setopt(pycurl.HTTPHEADER, self.headers)

    def _header(self, line: bytes) -> None:
        text = line.decode("latin-1").strip()
        if text.startswith("HTTP/"):
            self.head.clear()
        name, colon, value = text.partition(":")
        if colon:
            self.head[name.strip().lower()] = value.strip()

    def finish(self) -> Transfer:
        self.status = self.curl.getinfo(pycurl.RESPONSE_CODE)
        self.curl.close()
        return self

    @property
    def data(self) -> bytes:
        return self.body.getvalue()


def run(*transfers: Transfer) -> float:
    """Run the transfers in parallel, one connection each; the wall time they took."""
    multi = pycurl.CurlMulti()
    for transfer in transfers:
        multi.add_handle(transfer.curl)
    started = time.monotonic()
    active = len(transfers)
    while active:
        status, active = multi.perform()
        if status == pycurl.E_CALL_MULTI_PERFORM:
            continue
        if active:
            multi.select(0.1)
    elapsed = time.monotonic() - started
    _, _, failed = multi.info_read()
    assert not failed, failed
    for transfer in transfers:
        multi.remove_handle(transfer.curl)
        transfer.finish()
    multi.close()
    return elapsed


def fetch(url: str, range_: str | None = None, headers: list[str] | None = None) -> Transfer:
    transfer = Transfer(url, range_, headers or [])
    run(transfer)
    return transfer


def sha256_field(data: bytes) -> str:
    return "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"


def parse_content_range(value: str) -> tuple[int, int, int]:
    span, _, total = value.removeprefix("bytes ").partition("/")
    first, _, last = span.partition("-")
    return int(first), int(last) + 1, int(total)


# -- --bandwidth-per-connection -----------------------------------------------------------
def test_bandwidth_per_connection_paces_one_and_multiplies_over_two(reference_server) -> None:
    size, rate = 8 * MIB, 4 * MIB
    server = reference_server("--files", "1", "--file-size", "8m", "--digest-header",
                              "--bandwidth-per-connection", "4m")
    url = server.url + "/get/" + NAME
    fetch(url, headers=["Range: bytes=0-0"])  # the ETag and digest are computed, not timed

    single = Transfer(url)
    alone = run(single)
    assert single.status == 200 and len(single.data) == size
    assert alone >= 0.8 * size / rate, f"8 MiB at 4 MiB/s took only {alone:.2f} s"
    assert single.head["repr-digest"] == sha256_field(single.data)
    single_rate = size / alone

    half = size // 2
    parts = [Transfer(url, f"0-{half - 1}"), Transfer(url, f"{half}-{size - 1}")]
    together = run(*parts)
    assert [p.status for p in parts] == [206, 206]
    assert parts[0].data + parts[1].data == single.data
    assert size / together >= 1.6 * single_rate, (
        f"two connections: {size / together / MIB:.2f} MiB/s, one: {single_rate / MIB:.2f}")
    assert together >= 0.8 * half / rate  # each of the two is paced as well
    # Repr-Digest of each part is the digest of the whole, and matches what arrived
    assert {p.head["repr-digest"] for p in parts} == {sha256_field(single.data)}


def test_pacing_keeps_keep_alive_answers_whole_and_small_bodies_are_paced(
        reference_server) -> None:
    """Several answers on one connection (the second waits for the first's pacing), with
    bodies sent whole by the server (up to 1 MiB): 3 x 512 KiB at 1 MiB/s."""
    server = reference_server("--files", "3", "--file-size", "512k",
                              "--bandwidth-per-connection", "1m", processes=2)
    parsed = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=20)
    started = time.monotonic()
    bodies = []
    for index in range(3):
        conn.request("GET", f"/get/f{index:010d}")
        response = conn.getresponse()
        assert response.status == 200
        data = response.read()
        assert response.getheader("ETag") == '"' + hashlib.md5(data).hexdigest() + '"'
        bodies.append(data)
    elapsed = time.monotonic() - started
    conn.close()
    assert [len(b) for b in bodies] == [512 * 1024] * 3 and len(set(bodies)) == 3
    assert elapsed >= 0.8 * 1.5, f"1.5 MiB at 1 MiB/s over one connection took {elapsed:.2f} s"


def test_no_limit_by_default_and_bad_rates_refused(reference_server) -> None:
    server = reference_server("--files", "1", "--file-size", "8m")
    url = server.url + "/get/" + NAME
    fetch(url, headers=["Range: bytes=0-0"])
    transfer = Transfer(url)
    elapsed = run(transfer)
    assert transfer.status == 200 and len(transfer.data) == 8 * MIB
    assert elapsed < 1.6  # far more than 4 MiB/s: not paced


@pytest.mark.parametrize(("args", "message"), [
    (["--bandwidth-per-connection", "fast"], "not a size"),
    (["--ignore-ranges", "--wrong-content-range"], "exclude each other"),
])
def test_bad_switches_are_usage_errors(args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "bulkfetch", "serve", "--port", "0", *args],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and message in result.stderr


# -- Repr-Digest ---------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["1000", "3m"])
def test_repr_digest_on_the_wire_matches_the_bytes_received(reference_server, size: str) -> None:
    server = reference_server("--files", "2", "--file-size", size, "--digest-header")
    url = server.url + "/get/" + NAME
    whole = fetch(url)
    assert whole.status == 200
    assert whole.head["repr-digest"] == sha256_field(whole.data)
    assert whole.head["etag"] == '"' + hashlib.md5(whole.data).hexdigest() + '"'
    part = fetch(url, "10-99")
    assert part.status == 206 and part.data == whole.data[10:100]
    assert part.head["repr-digest"] == whole.head["repr-digest"]
    plain = fetch(reference_server("--files", "2", "--file-size", size).url + "/get/" + NAME)
    assert "repr-digest" not in plain.head and plain.data == whole.data


# -- range faults --------------------------------------------------------------------------
def test_ignore_ranges_on_the_wire(reference_server) -> None:
    server = reference_server("--files", "1", "--file-size", "2m", "--ignore-ranges")
    url = server.url + "/get/" + NAME
    head = Transfer(url)
    head.curl.setopt(pycurl.NOBODY, 1)
    run(head)
    assert head.head["accept-ranges"] == "bytes"  # the lure
    part = fetch(url, f"{MIB}-")
    assert part.status == 200 and len(part.data) == 2 * MIB
    assert "content-range" not in part.head
    assert part.head["etag"] == '"' + hashlib.md5(part.data).hexdigest() + '"'


def test_wrong_content_range_on_the_wire(reference_server) -> None:
    server = reference_server("--files", "1", "--file-size", "2m", "--wrong-content-range")
    url = server.url + "/get/" + NAME
    whole = fetch(url)
    part = fetch(url, f"0-{MIB // 4 - 1}")
    assert part.status == 206
    start, stop, total = parse_content_range(part.head["content-range"])
    assert (start, stop, total) == (MIB // 4, MIB // 2, 2 * MIB)
    assert part.data == whole.data[start:stop] != whole.data[: MIB // 4]


def test_etag_salt_across_restarts_and_if_range(reference_server) -> None:
    first = reference_server("--files", "1", "--file-size", "2m")
    before = fetch(first.url + "/get/" + NAME)
    list_before = fetch(first.url + "/list")
    first.stop()
    second = reference_server("--files", "1", "--file-size", "2m", "--etag-salt", "run-2")
    url = second.url + "/get/" + NAME
    after = fetch(url)
    assert len(after.data) == len(before.data) and after.data != before.data
    assert after.head["etag"] != before.head["etag"]
    assert after.head["etag"] == '"' + hashlib.md5(after.data).hexdigest() + '"'
    assert after.head["last-modified"] != before.head["last-modified"]
    assert fetch(second.url + "/list").data == list_before.data
    # resuming with the old validator: the whole new body, not a 206 of mixed bytes
    stale = fetch(url, f"{MIB}-", [f"If-Range: {before.head['etag']}"])
    assert stale.status == 200 and stale.data == after.data
    fresh = fetch(url, f"{MIB}-", [f"If-Range: {after.head['etag']}"])
    assert fresh.status == 206 and fresh.data == after.data[MIB:]
