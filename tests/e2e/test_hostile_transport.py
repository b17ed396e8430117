"""`bulkfetch get` against a server that misbehaves on the wire (RELIABILITY.md hostile cases
5-10 and the timeouts): trickling, silent and unreachable servers, bodies shorter or longer
than announced, wrong checksums, Retry-After in both forms and absurdly large, permanent
client errors, redirects, gzip bombs and a list page of ten million names. The real CLI runs
in a subprocess against the reference server's fault switches; every stored file is checked
against the data set's formula and the server's access log says what really happened."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from getkit import (
    assert_complete,
    assert_state_clean,
    expected_files,
    get,
    stored_files,
)

from bulkfetch.testing import LoggedRequest, ReferenceServer

Start = Callable[..., ReferenceServer]
GET = re.compile(r"/get/(f\d{10})")


def gets(server: ReferenceServer) -> list[LoggedRequest]:
    return [r for r in server.requests() if r.target.startswith("/get/")]


def name_of(request: LoggedRequest) -> str:
    match = GET.match(request.target)
    assert match, request.target
    return match.group(1)


def get_urls(urls: list[str], tmp_path: Path, *extra: str,
             timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`bulkfetch get --from-file` over `urls` into tmp_path/dest; files land at their URL's
    path, DEST/get/<name>."""
    listing = tmp_path / "urls.txt"
    listing.write_text("".join(url + "\n" for url in urls))
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", "--from-file", str(listing),
                           str(tmp_path / "dest"), "--workers", "2", "--report", str(report),
                           *extra], capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(report.read_text()) if report.exists() else {}


def under_get(files: dict[str, str]) -> dict[str, str]:
    return {f"get/{name}": digest for name, digest in files.items()}


@contextlib.contextmanager
def blackhole() -> Iterator[int]:
    """A port whose connects hang: a listener that never accepts, its queue already full,
    so the kernel drops further SYNs (as a firewall that drops packets does)."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.1)
        yield port
    finally:
        for sock in (*fillers, listener):
            sock.close()


# -- 7. timeouts -------------------------------------------------------------------------------
def test_trickling_bodies_are_cut_by_the_minimum_speed(reference_server: Start,
                                                       tmp_path: Path) -> None:
    files = 300
    server = reference_server("--files", str(files), "--page-size", "100",
                              "--trickle-rate", "0.05", access_log=True)
    started = time.monotonic()
    proc, report = get(server.url, tmp_path / "dest", tmp_path / "r.json", "--idle-timeout", "2",
                       "--concurrency", "32", timeout=90)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    trickled = [r for r in gets(server) if r.fault == "trickle"]
    assert trickled, "the server trickled nothing: the test proves nothing"
    assert report["retries"] >= len(trickled)
    # A 100-byte body at 1 byte/s takes 100 s; cut after ~2 s each, in parallel.
    assert elapsed < 60, f"took {elapsed:.0f} s: trickles were waited out"
    assert_complete(tmp_path / "dest", expected_files(files))


def test_total_timeout_cuts_a_trickle_the_minimum_speed_lets_through(
        reference_server: Start, tmp_path: Path) -> None:
    files = 100
    server = reference_server("--files", str(files), "--trickle-rate", "0.1", access_log=True)
    expected = expected_files(files)
    proc, report = get_urls([f"{server.url}/get/{n}" for n in sorted(expected)], tmp_path,
                            "--min-speed", "1", "--timeout", "2", "--retries", "0")
    assert proc.returncode == 1, proc.stderr
    trickled = {name_of(r) for r in gets(server) if r.fault == "trickle"}
    assert trickled
    failed = {f["name"]: f["reason"] for f in report["failures"]}
    assert set(failed) == {f"get/{n}" for n in trickled}
    assert all("timed out" in reason.lower() for reason in failed.values()), failed
    assert stored_files(tmp_path / "dest") == under_get(
        {n: d for n, d in expected.items() if n not in trickled})
    assert_state_clean(tmp_path / "dest")


def test_a_silent_server_is_cut_by_the_idle_timeout(reference_server: Start,
                                                    tmp_path: Path) -> None:
    files = 500
    server = reference_server("--files", str(files), "--page-size", "100",
                              "--stall-rate", "0.03", access_log=True)
    # a fixed -c: under auto a silent request is hedged well before any idle timeout
    proc, report = get(server.url, tmp_path / "dest", tmp_path / "r.json", "--idle-timeout", "1",
                       "-c", "16", timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert any(r.fault == "stall" for r in server.requests())
    assert report["retries"] > 0
    assert_complete(tmp_path / "dest", expected_files(files))


def test_a_connect_that_hangs_is_cut_by_the_connect_timeout(reference_server: Start,
                                                            tmp_path: Path) -> None:
    files = 50
    server = reference_server("--files", str(files))
    expected = expected_files(files)
    with blackhole() as port:
        dead = [f"http://127.0.0.1:{port}/get/gone-{i}" for i in range(3)]
        started = time.monotonic()
        proc, report = get_urls([f"{server.url}/get/{n}" for n in sorted(expected)] + dead,
                                tmp_path, "--connect-timeout", "1", "--retries", "1")
        elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    failed = {f["name"]: f for f in report["failures"]}
    assert set(failed) == {f"get/gone-{i}" for i in range(3)}
    for failure in failed.values():
        assert "timed out" in failure["reason"].lower(), failure
        assert failure["attempts"] == 2
    assert elapsed < 30, f"took {elapsed:.0f} s with a 1 s connect timeout"
    assert stored_files(tmp_path / "dest") == under_get(expected)


# -- 5. bodies that do not match what was announced ------------------------------------------
def test_short_bodies_and_wrong_checksums_are_retried(reference_server: Start,
                                                      tmp_path: Path) -> None:
    files = 1000
    server = reference_server("--files", str(files), "--page-size", "100", "--truncate-rate",
                              "0.05", "--corrupt-rate", "0.05", "--overlong-rate", "0.05",
                              access_log=True)
    proc, report = get(server.url, tmp_path / "dest", tmp_path / "r.json", timeout=90)
    assert proc.returncode == 0, proc.stderr
    faults = {r.fault for r in gets(server)}
    assert {"truncate", "corrupt", "overlong"} <= faults, faults
    assert report["files_ok"] == files and report["retries"] > 0
    assert_complete(tmp_path / "dest", expected_files(files))


def test_persistent_short_or_corrupt_bodies_are_reported_and_never_stored(
        reference_server: Start, tmp_path: Path) -> None:
    files = 200
    server = reference_server("--files", str(files), "--truncate-rate", "0.15",
                              "--corrupt-rate", "0.15", access_log=True)
    expected = expected_files(files)
    proc, report = get_urls([f"{server.url}/get/{n}" for n in sorted(expected)], tmp_path,
                            "--retries", "0")
    assert proc.returncode == 1, proc.stderr
    fault_of = {name_of(r): r.fault for r in gets(server)}
    bad = {n for n, fault in fault_of.items() if fault in ("truncate", "corrupt")}
    failed = {f["name"].removeprefix("get/"): f["reason"] for f in report["failures"]}
    assert set(failed) == bad and bad
    for name, reason in failed.items():
        if fault_of[name] == "corrupt":
            assert "MD5" in reason, reason
        else:
            assert re.search(r"bytes|partial|closed|curl error", reason), reason
    assert stored_files(tmp_path / "dest") == under_get(
        {n: d for n, d in expected.items() if n not in bad})
    assert_state_clean(tmp_path / "dest")


# -- 6. Retry-After --------------------------------------------------------------------------
def test_absurd_retry_after_in_both_forms_is_capped(reference_server: Start,
                                                    tmp_path: Path) -> None:
    files = 400
    server = reference_server("--files", str(files), "--page-size", "100", "--throttle-rate",
                              "0.05", "--fail-rate", "0.05", "--retry-after", "1000000000",
                              access_log=True)
    started = time.monotonic()
    proc, report = get(server.url, tmp_path / "dest", tmp_path / "r.json",
                       "--max-retry-wait", "0.5", timeout=90)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    statuses = {r.status for r in server.requests()}
    assert {429, 503} <= statuses, statuses
    assert report["retries"] > 0
    assert elapsed < 60, f"took {elapsed:.0f} s: Retry-After was not capped"
    assert_complete(tmp_path / "dest", expected_files(files))


# -- permanent errors ------------------------------------------------------------------------
def test_permanent_client_errors_are_not_retried(reference_server: Start,
                                                 tmp_path: Path) -> None:
    files = 500
    server = reference_server("--files", str(files), "--page-size", "100", "--deny-rate", "0.1",
                              access_log=True)
    proc, report = get(server.url, tmp_path / "dest", tmp_path / "r.json")
    assert proc.returncode == 1, proc.stderr
    denied: dict[str, list[int]] = {}
    for request in gets(server):
        if request.status in (400, 401, 403, 404, 410):
            denied.setdefault(name_of(request), []).append(request.status)
    assert {s for codes in denied.values() for s in codes} == {400, 401, 403, 404, 410}
    assert all(len(codes) == 1 for codes in denied.values()), "a denied file was retried"
    failed = {f["name"]: f for f in report["failures"]}
    assert set(failed) == set(denied)
    for name, failure in failed.items():
        assert failure["reason"] == f"HTTP {denied[name][0]}" and failure["attempts"] == 1
    expected = expected_files(files)
    assert stored_files(tmp_path / "dest") == {n: d for n, d in expected.items()
                                               if n not in denied}
    assert_state_clean(tmp_path / "dest")


# -- 9. redirects ----------------------------------------------------------------------------
def test_redirects_are_followed_without_leaking_credentials(reference_server: Start,
                                                            tmp_path: Path) -> None:
    files = 400
    server = reference_server("--files", str(files), "--page-size", "100", "--redirect-rate",
                              "0.1", "--redirect-to", "other-host,relative", access_log=True)
    with_credentials = server.url.replace("http://", "http://alice:s3cr3t-pw@")
    proc, report = get(with_credentials, tmp_path / "dest", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    requests = server.requests()
    assert report["files_ok"] == files
    moved = [r for r in requests if r.host.startswith("localhost:")]
    assert moved, "nothing was redirected to the other host name"
    assert not [r for r in moved if r.auth], "credentials were sent to another host"
    assert all(r.auth for r in requests if r.host.startswith("127.0.0.1:"))
    assert any("redirected=1" in r.target for r in requests)
    assert_complete(tmp_path / "dest", expected_files(files))
    for text in (proc.stdout, proc.stderr, (tmp_path / "r.json").read_text()):
        assert "s3cr3t-pw" not in text


@pytest.mark.parametrize("kind, reason", [("file", r"protocol|scheme"),
                                          ("loop", r"redirect")])
def test_redirects_to_files_and_loops_fail_that_file_only(reference_server: Start,
                                                          tmp_path: Path, kind: str,
                                                          reason: str) -> None:
    files = 200
    server = reference_server("--files", str(files), "--redirect-rate", "0.1",
                              "--redirect-to", kind, access_log=True)
    proc, report = get(server.url, tmp_path / "dest", tmp_path / "r.json", "--retries", "0")
    assert proc.returncode == 1, proc.stderr
    failed = {f["name"]: f["reason"] for f in report["failures"]}
    redirected = {name_of(r) for r in gets(server) if r.status == 302}
    assert failed and set(failed) == redirected
    assert all(re.search(reason, text, re.IGNORECASE) for text in failed.values()), failed
    expected = expected_files(files)
    stored = stored_files(tmp_path / "dest")
    assert stored == {n: d for n, d in expected.items() if n not in redirected}
    passwd = hashlib.md5(Path("/etc/passwd").read_bytes()).hexdigest()
    assert passwd not in stored.values()
    if kind == "loop":  # the hop limit ends each loop
        hops = [r for r in gets(server) if name_of(r) == sorted(redirected)[0]]
        assert 2 <= len(hops) <= 10, len(hops)


# -- 10. encodings ---------------------------------------------------------------------------
def test_a_gzip_bomb_is_stored_as_sent_and_never_decoded(reference_server: Start,
                                                         tmp_path: Path) -> None:
    files = 300
    server = reference_server("--files", str(files), "--page-size", "100", "--encoding-rate",
                              "0.05", access_log=True)
    proc, report = get(server.url, tmp_path / "dest", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    bombs = {name_of(r) for r in gets(server) if r.fault == "encoding"}
    assert bombs and report["files_ok"] == files
    expected = expected_files(files)
    stored = stored_files(tmp_path / "dest")
    assert set(stored) == set(expected)
    for name in bombs:
        body = (tmp_path / "dest" / name).read_bytes()
        assert body[:2] == b"\x1f\x8b" and len(body) < 1 << 20, (name, len(body))
    assert all(stored[n] == expected[n] for n in expected if n not in bombs)


# -- 8. a page of ten million names ----------------------------------------------------------
def test_a_page_of_ten_million_names_is_refused_clearly(reference_server: Start,
                                                        tmp_path: Path) -> None:
    server = reference_server("--files", "10000000", "--huge-page", "10000000")
    dest = tmp_path / "dest"
    proc, report = get(server.url, dest, tmp_path / "r.json", "--workers", "1", timeout=120)
    # the run's first page: only the user can decide to trust such pages (exit 2, no DEST)
    assert proc.returncode == 2, proc.stderr
    said = " ".join(proc.stderr.split())
    assert "larger than 16,777,216 bytes" in said and "--max-page-size" in said
    assert report["files_ok"] == 0 and not report["listing_complete"]
    assert "larger than" in report["error"]
    assert not dest.exists()
