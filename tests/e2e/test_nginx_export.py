"""`bulkfetch serve --export-static` run under real nginx answers byte-for-byte like the live
`bulkfetch serve` over the same data set."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bulkfetch.server.app import BAD_TOKEN_BODY, NOT_FOUND_BODY
from bulkfetch.util.ports import free_port

Answer = tuple[int, dict[str, str], bytes]
FILE_HEADERS = ("etag", "content-length", "last-modified", "content-type")


def _nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("nginx is missing: .ci/run must install nginx-light")
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    return found


def _export(directory: Path, port: int, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bulkfetch", "serve", "--export-static", str(directory),
         "--port", str(port), *flags],
        capture_output=True, text=True, timeout=120, check=False,
    )


class Nginx:
    """`nginx -c CONFIG -g 'daemon off;'` in its own session, so it is stopped whole."""

    def __init__(self, config: Path, port: int) -> None:
        self.config = config
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> Nginx:
        self.process = subprocess.Popen(
            [_nginx_binary(), "-c", str(self.config), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )
        port = int(self.url.rsplit(":", 1)[1])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        log = self.config.parent / "run" / "error.log"
        details = log.read_text() if log.exists() else ""
        raise RuntimeError(f"nginx did not start: {self._stderr()}{details}")

    def _stderr(self) -> str:
        stream = self.process.stderr if self.process else None
        return stream.read().decode(errors="replace") if stream else ""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # nginx: fast shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()


@pytest.fixture
def exported_nginx(tmp_path: Path) -> Iterator[Callable[..., Nginx]]:
    """Call with serve flags: export that data set with the real CLI, start nginx on it."""
    started: list[Nginx] = []

    def start(*flags: str) -> Nginx:
        _nginx_binary()
        port = free_port()
        directory = tmp_path / f"export{len(started)}"
        done = _export(directory, port, *flags)
        assert done.returncode == 0, done.stderr
        assert f"nginx -c {directory / 'nginx.conf'} -g 'daemon off;'" in done.stdout
        nginx = Nginx(directory / "nginx.conf", port)
        started.append(nginx)
        return nginx.start()

    yield start
    for nginx in started:
        nginx.stop()


class Client:
    """One keep-alive connection."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)

    def ask(self, target: str, method: str = "GET", headers: dict[str, str] | None = None
            ) -> Answer:
        self.conn.request(method, target, headers=headers or {})
        response = self.conn.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body


class Pair:
    """The same request to the live server and to nginx."""

    def __init__(self, live_url: str, nginx_url: str) -> None:
        self.live = Client(live_url)
        self.nginx = Client(nginx_url)

    def ask(self, target: str, method: str = "GET", headers: dict[str, str] | None = None
            ) -> tuple[Answer, Answer]:
        return self.live.ask(target, method, headers), self.nginx.ask(target, method, headers)

    def same(self, target: str, compared: tuple[str, ...], method: str = "GET",
             headers: dict[str, str] | None = None) -> Answer:
        """Ask both; status, body and the `compared` headers must be equal. The live answer."""
        live, nginx = self.ask(target, method, headers)
        assert nginx[0] == live[0], (target, live, nginx)
        assert nginx[2] == live[2], target
        for name in compared:
            assert nginx[1].get(name) == live[1].get(name), (target, name)
        return live


def _get_path(name: str) -> str:
    return "/get/" + urllib.parse.quote(name)


def _walk_both(pair: Pair) -> tuple[list[str], list[str]]:
    """Every list page, equal on both servers. Returns (names, tokens)."""
    names: list[str] = []
    tokens: list[str] = []
    target = "/list"
    while True:
        status, headers, body = pair.same(target, ("content-type", "x-total-files"))
        assert status == 200, body
        assert headers["content-type"] == "application/json"
        page = json.loads(body)
        names += page["FileNames"]
        if "NextMarker" not in page:
            return names, tokens
        tokens.append(page["NextMarker"])
        target = "/list?next-marker=" + urllib.parse.quote(page["NextMarker"])


def _forged(token: str) -> str:
    return token[:-1] + ("A" if token[-1] != "A" else "B")


DATA_SETS = {
    "flat": ("--files", "2500", "--page-size", "100"),
    "nested": ("--files", "2500", "--page-size", "100", "--nested", "--seed", "3"),
    "lognormal": ("--files", "600", "--page-size", "64", "--file-size",
                  "lognormal:16k:1.0:200k", "--seed", "11"),
    "large-no-total": ("--files", "5", "--page-size", "2", "--file-size", "uniform:1m:3m",
                       "--no-total"),
}


@pytest.mark.nginx
@pytest.mark.parametrize("flags", DATA_SETS.values(), ids=DATA_SETS.keys())
def test_nginx_export_answers_like_the_live_server(
    flags: tuple[str, ...], reference_server, exported_nginx
) -> None:
    live = reference_server(*flags)
    nginx = exported_nginx(*flags)
    pair = Pair(live.url, nginx.url)
    files = int(flags[flags.index("--files") + 1])

    names, tokens = _walk_both(pair)
    assert len(names) == files == len(set(names))
    total = pair.live.ask("/list")[1].get("x-total-files")
    assert total == (None if "--no-total" in flags else str(files))

    sizes: dict[str, int] = {}
    for name in {*names[::5], names[-1]}:
        _, headers, _ = pair.same(_get_path(name), FILE_HEADERS, method="HEAD")
        sizes[name] = int(headers["content-length"])
    largest = max(sizes, key=sizes.__getitem__)
    for name in {*names[::97], names[-1], largest}:
        status, headers, body = pair.same(_get_path(name), FILE_HEADERS)
        assert status == 200
        assert headers["etag"] == '"' + hashlib.md5(body).hexdigest() + '"'

    size = sizes[largest]
    span = (1000, 70999) if size > 71000 else (size // 4, size // 2)  # across a 64 KiB chunk
    ranged = {"Range": f"bytes={span[0]}-{span[1]}"}
    status, _, body = pair.same(_get_path(largest), ("content-range", "etag"), headers=ranged)
    assert status == 206 and len(body) == span[1] - span[0] + 1

    several = {"Range": "bytes=0-1,5-6"}  # both ignore multi-range and list-page ranges
    assert pair.same(_get_path(largest), ("etag",), headers=several)[0] == 200
    assert pair.same("/list", ("content-type",), headers={"Range": "bytes=0-9"})[0] == 200

    etag = pair.live.ask(_get_path(largest), method="HEAD")[1]["etag"]
    status, _, _ = pair.same(_get_path(largest), ("etag", "last-modified"),
                             headers={"If-None-Match": etag})
    assert status == 304

    if tokens:
        status, _, body = pair.same("/list?next-marker=" + _forged(tokens[0]), ("content-type",))
        assert (status, body) == (400, BAD_TOKEN_BODY)
    status, _, body = pair.same("/list?next-marker=", ("content-type",))
    assert (status, body) == (400, BAD_TOKEN_BODY)
    directory = "/get/" + names[0].rpartition("/")[0]  # nested: a directory, not a file
    for unknown in ("/get/no-such-file", _get_path(names[0] + "x"), directory, "/elsewhere"):
        status, headers, body = pair.same(unknown, ("content-type",))
        assert (status, body, headers["content-type"]) == (404, NOT_FOUND_BODY,
                                                          "application/json")


REFUSED = {
    "hostile-names": ("--hostile-names",),
    "bad-pages": ("--bad-pages",),
    "faults": ("--fail-rate", "0.1"),
    "latency": ("--latency", "5"),
    "root": ("--root", "/"),
}


@pytest.mark.parametrize("flags", REFUSED.values(), ids=REFUSED.keys())
def test_export_refuses_what_only_the_live_server_can_do(
    flags: tuple[str, ...], tmp_path: Path
) -> None:
    done = _export(tmp_path / "export", free_port(), "--files", "10", *flags)
    assert done.returncode == 2, done.stderr
    assert "--export-static" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "export").exists()


def test_an_export_it_cannot_write_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    done = _export(tmp_path / "afile" / "export", free_port(), "--files", "10")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "cannot write" in done.stderr and "Not a directory" in done.stderr


def test_export_replaces_an_earlier_export_but_never_a_foreign_directory(
    tmp_path: Path
) -> None:
    export = tmp_path / "export"
    shrinking = (("--files", "10"), ("--files", "10", "--nested"),
                 ("--files", "3", "--nested", "--file-size", "40"))
    for flags in shrinking:
        done = _export(export, free_port(), *flags)
        assert done.returncode == 0, done.stderr
    listed = json.loads((export / "pages" / "first").read_bytes())["FileNames"]
    on_disk = [p for p in (export / "files").rglob("*") if p.is_file()]
    assert sorted(p.relative_to(export / "files").as_posix() for p in on_disk) == sorted(listed)
    assert len(listed) == 3 and all(name.count("/") == 2 for name in listed)
    assert all(p.stat().st_size == 40 for p in on_disk)
    assert all(any(d.iterdir()) for d in (export / "files").rglob("*") if d.is_dir())

    (tmp_path / "keep.txt").write_text("mine")
    done = _export(tmp_path, free_port(), "--files", "10")
    assert done.returncode == 2 and "not empty" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "keep.txt"]


@pytest.mark.nginx
def test_get_from_nginx_with_its_own_etags_checks_lengths_and_stores_every_file(
        tmp_path: Path) -> None:
    """nginx's own ETag ("mtime-size") is no MD5: every file takes the fetcher's reading of
    the whole header block, and nothing may be taken for a mismatch."""
    port = free_port()
    export = tmp_path / "export"
    done = _export(export, port, "--files", "3000", "--page-size", "500")
    assert done.returncode == 0, done.stderr
    config = export / "nginx.conf"
    text = config.read_text()
    assert text.count("add_header ETag $bulkfetch_etag always;") == 2
    config.write_text(text.replace("etag off;", "etag on;").replace(
        "add_header ETag $bulkfetch_etag always;", ""))
    nginx = Nginx(config, port).start()
    try:
        first = Client(nginx.url).ask(_get_path("f0000000000"))
        assert first[0] == 200 and "-" in first[1]["etag"], first[1]
        dest, report = tmp_path / "dest", tmp_path / "report.json"
        got = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", nginx.url, str(dest), "--workers", "1",
             "-q", "--report", str(report)],
            capture_output=True, text=True, timeout=300, check=False)
    finally:
        nginx.stop()
    assert got.returncode == 0, got.stderr[-2000:]
    summary = json.loads(report.read_text())
    assert summary["files_ok"] == 3000 and summary["files_failed"] == 0
    assert summary["retries"] == 0
    stored = sorted(p.name for p in dest.iterdir() if p.is_file())
    assert len(stored) == 3000
    for name in stored[::97]:
        assert hashlib.md5((dest / name).read_bytes()).digest() == hashlib.md5(
            (export / "files" / name).read_bytes()).digest()
