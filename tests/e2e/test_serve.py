"""`bulkfetch serve` seen from real HTTP clients over loopback."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from bulkfetch.testing import ReferenceServer


class Client:
    """One keep-alive connection to the server."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)

    def get(self, target: str, method: str = "GET",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        self.conn.request(method, target, headers=headers or {})
        response = self.conn.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body

    def walk(self) -> list[tuple[dict[str, str], dict[str, object]]]:
        pages, target = [], "/list"
        while True:
            status, headers, body = self.get(target)
            assert status == 200, body
            page = json.loads(body)
            pages.append((headers, page))
            if "NextMarker" not in page:
                return pages
            target = "/list?next-marker=" + urllib.parse.quote(page["NextMarker"])


def _get_path(name: str) -> str:
    return "/get/" + urllib.parse.quote(name)


def test_walk_25000_files_every_body_matches_its_etag(reference_server) -> None:
    server = reference_server("--files", "25000", "--page-size", "1000")
    client = Client(server.url)
    pages = client.walk()
    assert len(pages) == 25
    names = [n for _, page in pages for n in page["FileNames"]]
    assert len(names) == 25000 and len(set(names)) == 25000
    assert all(h["x-total-files"] == "25000" for h, _ in pages)
    assert all(h["content-type"] == "application/json" for h, _ in pages)
    for name in names:
        status, headers, body = client.get(_get_path(name))
        assert status == 200
        assert int(headers["content-length"]) == len(body) == 100
        assert headers["etag"] == f'"{hashlib.md5(body).hexdigest()}"'


def test_forged_token_is_400_with_json_and_unknown_name_is_404(reference_server) -> None:
    server = reference_server("--files", "3000")
    client = Client(server.url)
    first = client.walk()[0][1]
    token = str(first["NextMarker"])
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for bad in (forged, "x", "", "../../etc/passwd"):
        status, headers, body = client.get("/list?next-marker=" + urllib.parse.quote(bad))
        assert status == 400, bad
        assert headers["content-type"] == "application/json"
        assert "error" in json.loads(body)
    status, _, body = client.get("/get/f9999999999")
    assert status == 404 and json.loads(body)["error"]
    status, _, _ = client.get("/get/f0000003000")  # one past the last index
    assert status == 404


def test_tokens_survive_a_restart_and_are_bound_to_the_data_set() -> None:
    with ReferenceServer("--files", "5000", "--seed", "7") as first:
        client = Client(first.url)
        _, _, body = client.get("/list")
        token = json.loads(body)["NextMarker"]
        _, _, page_two = client.get("/list?next-marker=" + token)
    with ReferenceServer("--files", "5000", "--seed", "7") as again:
        status, _, body = Client(again.url).get("/list?next-marker=" + token)
        assert status == 200 and body == page_two
    with ReferenceServer("--files", "5000", "--seed", "8") as other:
        status, _, _ = Client(other.url).get("/list?next-marker=" + token)
        assert status == 400


def test_ten_billion_files_answer_at_once(reference_server) -> None:
    started = time.monotonic()
    server = reference_server("--files", "10000000000")
    status, headers, body = Client(server.url).get("/list")
    elapsed = time.monotonic() - started
    assert status == 200
    page = json.loads(body)
    assert headers["x-total-files"] == "10000000000"
    assert page["FileNames"][0] == "f0000000000" and len(page["FileNames"]) == 1000
    # Start-up must not scale with --files: a scan of 10^10 names would take hours.
    assert elapsed < 10, elapsed
    status, _, body = Client(server.url).get("/get/f9999999999")
    assert status == 200 and len(body) == 100


def test_head_range_and_conditional_requests(reference_server) -> None:
    server = reference_server("--files", "10", "--file-size", "1000")
    client = Client(server.url)
    status, full_headers, full = client.get("/get/f0000000004")
    assert status == 200 and len(full) == 1000
    etag, modified = full_headers["etag"], full_headers["last-modified"]
    status, headers, body = client.get("/get/f0000000004", method="HEAD")
    assert status == 200 and body == b"" and headers["content-length"] == "1000"
    assert headers["etag"] == etag
    status, headers, body = client.get("/get/f0000000004", headers={"Range": "bytes=100-199"})
    assert status == 206 and body == full[100:200]
    assert headers["content-range"] == "bytes 100-199/1000"
    status, _, body = client.get("/get/f0000000004", headers={"Range": "bytes=-10"})
    assert status == 206 and body == full[-10:]
    status, headers, _ = client.get("/get/f0000000004", headers={"Range": "bytes=5000-"})
    assert status == 416 and headers["content-range"] == "bytes */1000"
    status, _, body = client.get("/get/f0000000004", headers={"If-None-Match": etag})
    assert status == 304 and body == b""
    status, _, body = client.get("/get/f0000000004", headers={"If-None-Match": '"other"'})
    assert status == 200 and body == full
    status, _, _ = client.get("/get/f0000000004", headers={"If-Modified-Since": modified})
    assert status == 304
    status, _, _ = client.get(
        "/get/f0000000004", headers={"If-Modified-Since": "Mon, 01 Jan 2024 00:00:00 GMT"}
    )
    assert status == 200


def test_large_bodies_stream_and_match_their_etag(reference_server) -> None:
    server = reference_server("--files", "2", "--file-size", "5m")
    status, headers, body = Client(server.url).get("/get/f0000000001")
    assert status == 200 and len(body) == 5 * 1024 * 1024
    assert headers["etag"] == f'"{hashlib.md5(body).hexdigest()}"'


def test_nested_names_and_lognormal_sizes(reference_server) -> None:
    server = reference_server("--files", "500", "--nested", "--file-size",
                              "lognormal:2k:1.0:50k", "--page-size", "100")
    client = Client(server.url)
    names = [n for _, page in client.walk() for n in page["FileNames"]]
    assert len(set(names)) == 500
    assert all(n.count("/") == 2 and n.split("/")[2].startswith("f") for n in names)
    sizes = set()
    for name in names[:50]:
        status, headers, body = client.get(_get_path(name))
        assert status == 200 and headers["etag"] == f'"{hashlib.md5(body).hexdigest()}"'
        assert len(body) <= 50 * 1024
        sizes.add(len(body))
    assert len(sizes) > 10  # sizes are drawn per file, not constant


def test_two_processes_share_the_port(reference_server) -> None:
    server = reference_server("--files", "1000", processes=2, access_log=True)

    def hammer() -> None:
        for _ in range(5):
            client = Client(server.url)  # new connections spread over the processes
            for i in range(20):
                assert client.get(f"/get/f{i:010d}")[0] == 200

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.3)
    rows = server.requests()
    assert len(rows) == 8 * 5 * 20
    assert len({row.pid for row in rows}) == 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("processes", [1, 2])
def test_clean_exit_on_signal(sig: int, processes: int) -> None:
    server = ReferenceServer("--files", "10", processes=processes).start()
    assert Client(server.url).get("/list")[0] == 200
    assert server.process is not None
    server.process.send_signal(sig)
    code = server.process.wait(10)
    stderr = server.process.stderr.read().decode() if server.process.stderr else ""
    server.stop()
    assert code == 0, stderr
    assert "Traceback" not in stderr


def test_root_serves_a_real_tree_and_nothing_outside(reference_server, tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"top secret")
    expected = {}
    for rel in ["a.txt", "b/c.bin", "b/d/e", "b/d/f", "z", "sp ace/é.txt"]:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(50 + len(rel))
        path.write_bytes(data)
        expected[rel] = data
    (root / "leak").symlink_to(outside / "secret")
    (root / "leakdir").symlink_to(outside)
    (root / "alias").symlink_to(root / "a.txt")
    expected["alias"] = expected["a.txt"]
    server = reference_server("--root", str(root), "--page-size", "2")
    client = Client(server.url)
    pages = client.walk()
    names = [n for _, page in pages for n in page["FileNames"]]
    assert names == sorted(expected, key=lambda n: n.split("/"))
    assert len(pages) == 4
    for name, data in expected.items():
        status, headers, body = client.get(_get_path(name))
        assert status == 200 and body == data
        assert headers["etag"] == f'"{hashlib.md5(data).hexdigest()}"'
    for escape in ["leak", "leakdir/secret", "../outside/secret", "%2E%2E/outside/secret",
                   "b/../../outside/secret"]:
        status, _, body = client.get("/get/" + escape)
        assert status == 404, escape
        assert b"top secret" not in body


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bulkfetch", *args], capture_output=True,
                          text=True, timeout=30)


def test_a_port_in_use_is_refused_not_shared() -> None:
    # The server's processes share their port through SO_REUSEPORT, which would also let a
    # second server bind beside a first one: the kernel would split the connections
    # between two data sets without a word.
    with ReferenceServer("--files", "3") as first:
        port = first.url.rsplit(":", 1)[1]
        second = _cli("serve", "--files", "7", "--port", port)
        assert second.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in \
            second.stderr, second.stderr
        assert "serving" not in second.stdout


def test_version_and_help_on_every_command() -> None:
    import click

    from bulkfetch import __version__
    from bulkfetch.cli.main import cli

    assert __version__ in _cli("--version").stdout
    assert "Usage" in _cli("--help").stdout
    names = cli.list_commands(click.Context(cli))  # the lazily imported ones too
    assert {"get", "hash", "status", "demo"} <= set(names)
    for name in names:
        result = _cli(name, "--help")
        assert result.returncode == 0 and "Usage" in result.stdout, name


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--fail-rate", "2"], "--fail-rate"),
        (["--file-size", "huge"], "huge"),
        (["--bad-pages", "sideways"], "sideways"),
        (["--latency", "9-1"], "--latency"),
        (["--fail-rate", "0.7", "--reset-rate", "0.7"], "add up"),
        (["--root", "/definitely/not/here"], "/definitely/not/here"),
    ],
)
def test_bad_flags_exit_2_naming_the_input(args: list[str], mentions: str) -> None:
    result = _cli("serve", "--port", "0", *args)
    assert result.returncode == 2
    assert mentions in result.stderr
    assert "Traceback" not in result.stderr


def test_a_server_that_cannot_start_says_why() -> None:
    with pytest.raises(RuntimeError,
                       match=r"(?s)bulkfetch serve did not start: .*'no-such-size' is not a size"):
        ReferenceServer("--file-size", "no-such-size").start()
