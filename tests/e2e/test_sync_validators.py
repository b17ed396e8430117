"""`get --sync` against servers whose ETag is not the body's MD5 (issue 49): stock nginx
(ETag "mtime-size", Last-Modified) and `python -m http.server` (Last-Modified only), each
serving 2,000 files named by a URL list. An unchanged pass must move no body (the access
logs: every answer a 304 or no request); after 20 files change on the server, a pass
fetches those 20; DEST then equals the server's tree byte for byte."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from getkit import start_http_server
from test_nginx_export import Nginx, _nginx_binary

from bulkfetch.testing.static_nginx import ACCESS_LINE, static_site_config
from bulkfetch.util.ports import free_port

FILES, CHANGED = 2000, 20


@dataclass
class Site:
    root: Path
    urls: Path  # the URL list
    log: Path  # the access log: "STATUS BODY_BYTES TARGET" a line (after `pattern`)
    pattern: re.Pattern[str]

    def answers(self) -> list[tuple[int, int, str]]:
        """(status, body bytes, target) of every request logged so far."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            match = self.pattern.search(line)
            if match:
                size = match["bytes"]  # python -m http.server logs "-" for every size
                found.append((int(match["status"]), int(size) if size.isdigit() else 0,
                              match["target"]))
        return found


def _tree(root: Path) -> None:
    rng = random.Random(49)
    for index in range(FILES):
        path = root / f"d{index % 20:02d}" / f"file {index:04d}.bin"  # a space: quoted URL
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(0, 3000)))
    old = time.time() - 3600  # an hour ago: a change later lands in another second
    for path in root.rglob("*.bin"):
        os.utime(path, (old, old))


def _url_list(root: Path, base: str, out: Path) -> Path:
    out.write_text("".join(f"{base}/{quote(p.relative_to(root).as_posix())}\n"
                           for p in sorted(root.rglob("*.bin"))))
    return out


def _nginx(tmp_path_factory: pytest.TempPathFactory, settings: str) -> Iterator[Site]:
    _nginx_binary()
    home = tmp_path_factory.mktemp("nginx")
    run, root = home / "run", home / "site"
    _tree(root)
    port = free_port()
    static_site_config(home, root, port, settings)
    server = Nginx(home / "nginx.conf", port).start()
    try:
        yield Site(root, _url_list(root, server.url, home / "urls.txt"), run / "access.log",
                   ACCESS_LINE)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def nginx_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """Stock nginx (its own ETags and Last-Modified: nothing about them configured)."""
    yield from _nginx(tmp_path_factory, "")


@pytest.fixture(scope="module")
def ignoring_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """nginx that ignores conditional requests: no ETag, and If-Modified-Since not
    looked at (every answer a 200 with the whole body)."""
    yield from _nginx(tmp_path_factory, "        etag off;\n        if_modified_since off;\n")


@pytest.fixture(scope="module")
def http_server_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """`python -m http.server`: Last-Modified and no ETag."""
    home = tmp_path_factory.mktemp("http-server")
    root = home / "site"
    _tree(root)
    log = home / "access.log"
    process, port = start_http_server(root, log)
    try:
        yield Site(root, _url_list(root, f"http://127.0.0.1:{port}", home / "urls.txt"), log,
                   re.compile(r'"GET (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3}) '
                              r'(?P<bytes>\d+|-)'))
    finally:
        process.terminate()
        process.wait(10)


def _dest_files(dest: Path) -> dict[str, bytes]:
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*.bin")
            if ".bulkfetch" not in p.parts}


def _site_files(site: Site) -> dict[str, bytes]:
    return {p.relative_to(site.root).as_posix(): p.read_bytes()
            for p in site.root.rglob("*.bin")}


def test_a_server_that_ignores_conditional_requests_leaves_equal_files_as_they_were(
        ignoring_site: Site, tmp_path: Path) -> None:
    """Every answer a 200: each body is compared with DEST's copy; an equal one is left as
    it was (same mtime), the summary says the server ignores conditional requests, and a
    changed file is replaced."""
    site = ignoring_site
    dest, report = tmp_path / "dest", tmp_path / "report.json"
    command = [sys.executable, "-m", "bulkfetch", "get", "--from-file", str(site.urls),
               str(dest), "--workers", "1", "--report", str(report)]
    assert subprocess.run(command, capture_output=True, timeout=300).returncode == 0
    stamps = {p: os.stat(dest / p).st_mtime_ns for p in _dest_files(dest)}
    rng = random.Random(8)
    changed = sorted(rng.sample(sorted(stamps), CHANGED))
    for rel in changed:
        (site.root / rel).write_bytes(rng.randbytes(rng.randint(1, 3000)))
    before = len(site.answers())
    done = subprocess.run([*command, "--sync"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answers = site.answers()[before:]
    assert {status for status, _, _ in answers} == {200} and len(answers) == FILES
    synced = json.loads(report.read_text())
    assert synced["unchanged_by"] == {"listing": 0, "not_modified": 0,
                                      "same_body": FILES - CHANGED}
    assert "the server ignores conditional requests" in done.stderr
    now = {p: os.stat(dest / p).st_mtime_ns for p in stamps}
    assert sorted(p for p in stamps if now[p] != stamps[p]) == changed  # only those rewritten
    assert _dest_files(dest) == _site_files(site)


BIG_BODIES = {"": [], "streamed": ["--spool-above", "1k"],
              "split": ["--spool-above", "1k", "--split-above", "2k", "--parts", "2"]}


@pytest.mark.parametrize(("which", "bodies"), [
    ("nginx_site", ""), ("nginx_site", "streamed"), ("nginx_site", "split"),
    ("http_server_site", "")],
    ids=["nginx", "nginx-streamed", "nginx-split", "http.server"])
def test_an_unchanged_pass_moves_no_body_and_a_changed_file_is_fetched(
        which: str, bodies: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """`bodies`: streamed, bodies over 1 KiB (most of them) written to disk as they arrive,
    the way a big file goes, rather than held in memory; split, those over 2 KiB fetched
    in two ranges too. Their validators are kept the same way, and a sync asks for them
    conditionally first, as for any file."""
    site: Site = request.getfixturevalue(which)
    dest, report = tmp_path / "dest", tmp_path / "report.json"
    command = ["--from-file", str(site.urls), str(dest), "--workers", "1",
               "--report", str(report), *BIG_BODIES[bodies]]
    streamed = bool(bodies)

    def run(*extra: str) -> tuple[dict, list[tuple[int, int, str]]]:
        before = len(site.answers())
        done = subprocess.run([sys.executable, "-m", "bulkfetch", "get", *command, *extra],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(report.read_text()), site.answers()[before:]

    first, answers = run()
    # (a body found over --spool-above is asked for again, streamed: a second request)
    assert first["files_ok"] == FILES and (len(answers) > FILES if streamed
                                           else len(answers) == FILES)
    if bodies == "split":
        assert first["ranged_size_only"] > 300, first  # (files in ranges: nginx gives no MD5)
    assert _dest_files(dest) == _site_files(site)
    stamps = {p: os.stat(dest / p).st_mtime_ns for p in _dest_files(dest)}

    # nothing changed: every file asked for once, every answer a 304 with no body
    synced, answers = run("--sync")
    assert synced["files_ok"] == FILES and synced["files_failed"] == 0
    # every file asked for (a hedge or redial may ask one twice: python -m http.server's
    # backlog of 5 drops a SYN now and then), every answer a 304
    assert len({target for _, _, target in answers}) == FILES
    assert {status for status, _, _ in answers} == {304}, answers[:5]
    assert sum(size for _, size, _ in answers) == 0
    assert {p: os.stat(dest / p).st_mtime_ns for p in stamps} == stamps  # left as they were
    assert synced["unchanged"] == FILES
    assert synced["unchanged_by"] == {"listing": 0, "not_modified": FILES, "same_body": 0}

    # 20 files change on the server (new bytes, a new modification time)
    rng = random.Random(7)
    changed = sorted(rng.sample(sorted(_site_files(site)), CHANGED))
    now = time.time()
    for rel in changed:
        path = site.root / rel
        path.write_bytes(rng.randbytes(rng.randint(1, 3000)))
        os.utime(path, (now, now))
    synced, answers = run("--sync")
    assert synced["files_ok"] == FILES and synced["files_failed"] == 0
    refetched = sorted({target for status, _, target in answers if status == 200})
    assert len(refetched) == CHANGED, refetched  # (a streamed one: asked twice, see above)
    # distinct files: a hedge or redial against the backlog of 5 may ask one twice
    assert len({target for status, _, target in answers if status == 304}) == FILES - CHANGED
    assert _dest_files(dest) == _site_files(site)  # DEST equals a fresh download

    # and a pass after that is all 304s again: the changed files' new validators were kept
    # (the sums were rewritten as one file: the validators went with them)
    synced, answers = run("--sync")
    assert {status for status, _, _ in answers} == {304}


def test_checksum_judges_by_content_alone(nginx_site: Site, tmp_path: Path) -> None:
    """--sync --checksum against stock nginx: asked by MD5 (which nginx's ETags never are),
    every answer is a 200, and each body is compared with DEST's copy: all equal, none
    rewritten. Without --sync the flag is a usage error, and nothing is written."""
    site = nginx_site
    dest, report = tmp_path / "dest", tmp_path / "report.json"
    command = [sys.executable, "-m", "bulkfetch", "get", "--from-file", str(site.urls),
               str(dest), "--workers", "1", "--report", str(report)]
    alone = subprocess.run([*command, "--checksum"], capture_output=True, text=True,
                           timeout=60)
    assert alone.returncode == 2 and "--checksum" in alone.stderr and "--sync" in alone.stderr
    assert not dest.exists()
    assert subprocess.run(command, capture_output=True, timeout=300).returncode == 0
    stamps = {p: os.stat(dest / p).st_mtime_ns for p in _dest_files(dest)}
    before = len(site.answers())
    done = subprocess.run([*command, "--sync", "--checksum"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    answers = site.answers()[before:]
    assert {status for status, _, _ in answers} == {200} and len(answers) == FILES
    assert json.loads(report.read_text())["unchanged_by"] == {
        "listing": 0, "not_modified": 0, "same_body": FILES}
    assert {p: os.stat(dest / p).st_mtime_ns for p in stamps} == stamps
