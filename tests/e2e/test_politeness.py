"""Politeness against the reference server, counted in its access log: --max-rps holds the
request rate of a host, and a 429 with Retry-After pauses that host (not only the file)
while another host of the same URL table goes on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pycurl
import pytest
from getkit import assert_complete, expected_files, stored_files

from bulkfetch.engine.hosts import HostGate
from bulkfetch.engine.pacing import BigPacing


def bulkfetch(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", *args, "--quiet"],
                          capture_output=True, text=True, timeout=180)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_max_rps_holds_the_rate_of_a_host(reference_server, tmp_path: Path) -> None:
    files, rate = 900, 150
    # pages of 100: both workers have work (each starts its share of the rate)
    server = reference_server("--files", str(files), "--page-size", "100", access_log=True)
    proc = bulkfetch(server.url, str(tmp_path / "d"), "--max-rps", str(rate), "-w", "2")
    assert proc.returncode == 0, proc.stderr
    assert_complete(tmp_path / "d", expected_files(files))
    times = sorted(r.time for r in server.requests() if r.target.startswith("/get/"))
    assert len(times) == files
    overall = (len(times) - 1) / (times[-1] - times[0])
    assert rate * 0.85 <= overall <= rate * 1.05, overall
    # any one second: the rate plus each worker's first tenth of a second saved up
    busiest = max(sum(1 for t in times[i:i + rate * 2] if t < start + 1.0)
                  for i, start in enumerate(times))
    assert busiest <= rate * 1.05 + rate / 10 + 1, busiest


def test_max_rps_goes_to_the_worker_that_has_the_requests(reference_server,
                                                          tmp_path: Path) -> None:
    """One page: one worker has every file, and held half of --max-rps (400 files at 100/s
    with -w 2: 50/s). The coordinator moves the shares to the worker whose transfers wait
    on its share (runners/rate_shares.py)."""
    files, rate = 400, 100
    server = reference_server("--files", str(files), access_log=True)
    proc = bulkfetch(server.url, str(tmp_path / "d"), "--max-rps", str(rate), "-w", "2",
                     "--sink", "null")
    assert proc.returncode == 0, proc.stderr
    times = sorted(r.time for r in server.requests() if r.target.startswith("/get/"))
    assert len(times) == files
    overall = (len(times) - 1) / (times[-1] - times[0])
    assert rate * 0.8 <= overall <= rate * 1.05, overall


def test_retry_after_pauses_the_host_and_another_host_goes_on(reference_server,
                                                              tmp_path: Path) -> None:
    files, pause = 150, 2
    throttled = reference_server("--files", str(files), "--throttle-rate", "0.03",
                                 "--retry-after", str(pause), access_log=True)
    steady = reference_server("--files", str(files), "--latency", "200", access_log=True)
    want = expected_files(files)
    rows = [f"{server.url}/get/{name},{label}/{name}\n"
            for name in sorted(want) for label, server in (("a", throttled), ("b", steady))]
    (tmp_path / "urls.csv").write_text("url,name\n" + "".join(rows))
    proc = bulkfetch("--from-file", str(tmp_path / "urls.csv"), "--name-col", "name",
                     str(tmp_path / "d"), "-w", "1", "-c", "8", "--report",
                     str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["files_ok"] == 2 * files
    assert stored_files(tmp_path / "d") == {f"{label}/{name}": digest
                                            for label in "ab" for name, digest in want.items()}
    a_log = throttled.requests()
    b_times = [r.time for r in steady.requests()]
    throttles = [r.time for r in a_log if r.status == 429]
    assert throttles, "no 429 was answered: nothing was tested"
    for when in throttles:
        # what was in flight when the 429 went out may still arrive just after it
        inside = [r for r in a_log if when + 0.2 < r.time < when + pause - 0.1]
        assert inside == [], (f"{len(inside)} requests to the paused host within {pause} s "
                              f"after a 429, e.g. {inside[:2]}")
        assert any(when + 0.2 < t < when + pause - 0.1 for t in b_times) or \
            max(b_times) < when + 0.2, "the other host stopped too"


def test_limit_rate_holds_the_bytes_of_a_host(reference_server, tmp_path: Path) -> None:
    files, size, rate = 300, 10_000, 500_000
    server = reference_server("--files", str(files), "--file-size", str(size), "--page-size",
                              "50", access_log=True)
    proc = bulkfetch(server.url, str(tmp_path / "d"), "--limit-rate", "500k", "-w", "2",
                     "--sink", "null")
    assert proc.returncode == 0, proc.stderr
    bodies = sorted((r.time, r.length) for r in server.requests()
                    if r.target.startswith("/get/"))
    assert len(bodies) == files and all(length == size for _, length in bodies)
    span = bodies[-1][0] - bodies[0][0]
    overall = (files - 1) * size / span
    assert rate * 0.85 <= overall <= rate * 1.05, overall
    busiest = max(sum(length for t, length in bodies[i:] if t < start + 1.0)
                  for i, (start, _) in enumerate(bodies))
    assert busiest <= rate * 1.05 + rate / 10 + 2 * size, busiest


@pytest.mark.parametrize("mode", [["--split-above", "1g"], ["--split-above", "4m", "--parts", "2"],
                                  ["--spool-above", "0"]],
                         ids=["streamed", "ranged", "all big"])
def test_limit_rate_holds_big_bodies_too(reference_server, tmp_path: Path,
                                         mode: list[str]) -> None:
    """Bodies over --spool-above, streamed or in ranges. Each body's in-memory attempt,
    stopped at its headers, gave nothing back to the host's estimate, and the run waited
    forever for a body to estimate by (seen: 2 x 64 MiB at 8m, killed after 60 s); and a
    big body was both paced and charged in full at its end (half the rate). Now its bytes
    are charged as they come, after a reserve taken as it starts (without which every big
    body, with --spool-above 0, started at once: 4x the rate)."""
    files, size, rate = 6, 8 << 20, 8 << 20
    server = reference_server("--files", str(files), "--file-size", "8m")
    report_path = tmp_path / "r.json"
    proc = bulkfetch(server.url, str(tmp_path / "d"), "--limit-rate", "8m", "-w", "1",
                     "--report", str(report_path), *mode)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["files_ok"] == files and report["bytes"] == files * size
    overall = report["bytes"] / report["duration_s"]
    # (seen: 0.985-1.012 over two runs of each mode)
    assert 0.8 * rate <= overall <= 1.25 * rate, overall / rate


def test_limit_rate_holds_one_file_in_ranges(reference_server, tmp_path: Path) -> None:
    """One file in 4 ranges: libcurl caps each connection at the whole rate, and the
    bucket only stops new ones starting, so 4 at once went at 3x the rate (64 MiB in 4
    parts at 16m: 3x). The pieces of a host in debt are held (paused) until it paid."""
    size, rate = 24 << 20, 8 << 20
    server = reference_server("--files", "1", "--file-size", "24m")
    report_path = tmp_path / "r.json"
    proc = bulkfetch(server.url, str(tmp_path / "d"), "--limit-rate", "8m", "-w", "1",
                     "--split-above", "4m", "--parts", "4", "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["files_ok"] == 1 and report["bytes"] == size
    overall = report["bytes"] / report["duration_s"]
    assert 0.8 * rate <= overall <= 1.25 * rate, overall / rate


def test_limit_rate_holds_bodies_of_many_sizes(reference_server, tmp_path: Path) -> None:
    """Lognormal sizes: small bodies in memory, charged the host's mean body size as they
    start, and bigger ones streamed. The start's mean was corrected by the store's, and
    while the mean rose from the first body's size every body in flight was charged too
    little (lognormal 64k median up to 16m at 20m: 1.43x the rate). Each stored body now
    settles what the starts in flight took, on average (hosts.HostGate.ledger)."""
    files, sizes, rate = 400, "lognormal:32k:2:8m", 12 << 20
    server = reference_server("--files", str(files), "--file-size", sizes, "--seed", "3")
    report_path = tmp_path / "r.json"
    proc = bulkfetch(server.url, str(tmp_path / "d"), "--limit-rate", "12m", "-w", "1",
                     "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["files_ok"] == files
    overall = report["bytes"] / report["duration_s"]
    assert 0.8 * rate <= overall <= 1.1 * rate, overall / rate


def test_limit_rate_goes_to_the_worker_that_has_the_bytes(reference_server,
                                                          tmp_path: Path) -> None:
    """One file, two workers: each worker held an even share of the rate, so the one with
    the file had half of it (64 MiB at 20m with -w 2: 10.2 MiB/s). The coordinator moves
    the shares to the workers whose transfers wait on theirs (runners/rate_shares.py)."""
    size, rate = 32 << 20, 8 << 20
    server = reference_server("--files", "1", "--file-size", "32m")
    report_path = tmp_path / "r.json"
    proc = bulkfetch(server.url, str(tmp_path / "d"), "--limit-rate", "8m", "-w", "2",
                     "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["files_ok"] == 1 and report["bytes"] == size
    overall = report["bytes"] / report["duration_s"]
    # (4 s of transfer: its start may run 0.2-0.4 s ahead, a full bucket per worker; CI saw
    # 1.102. Over 12 s the rate holds within 2%: 96 MiB at 8m gave 0.979-0.994.)
    assert 0.75 * rate <= overall <= 1.15 * rate, overall / rate


def test_a_new_share_leaves_held_bodies_held(reference_server) -> None:
    """libcurl takes a new receive cap on a paused transfer as leave to go on. When the
    coordinator moved a worker's share while a debt held its bodies, they went on at full
    speed: 4 files of 4 MiB through stream() at 4m came in 1.9 s about one run in three.
    BigPacing.hold_again() pauses the held ones again. Real libcurl, a body of 8 MiB
    paused after its first bytes, then a new cap as set_rate_share() sets it: nothing more
    may come."""
    server = reference_server("--files", "1", "--file-size", "8m")
    came = [0]

    def count(chunk: bytes) -> None:
        came[0] += len(chunk)

    handle = pycurl.Curl()
    handle.setopt(pycurl.URL, server.url.rstrip("/") + "/get/f0000000000")
    handle.setopt(pycurl.WRITEFUNCTION, count)
    handle.setopt(pycurl.MAX_RECV_SPEED_LARGE, 1 << 20)
    multi = pycurl.CurlMulti()
    multi.add_handle(handle)
    pacing = BigPacing(HostGate(byte_rate=1 << 20))
    deadline = time.monotonic() + 10
    while came[0] == 0 and time.monotonic() < deadline:
        multi.perform()
        multi.select(0.05)
    handle.pause(pycurl.PAUSE_RECV)  # as BigPacing.turn() holds a body of a host in debt
    pacing.held.add(handle)
    held_at = came[0]
    assert 0 < held_at < 8 << 20
    handle.setopt(pycurl.MAX_RECV_SPEED_LARGE, 2 << 20)  # the worker's share moved
    pacing.hold_again()
    until = time.monotonic() + 1.0
    while time.monotonic() < until:
        multi.perform()
        multi.select(0.05)
    assert came[0] == held_at, came[0] - held_at
    pacing.ended(handle, None)  # let go: the rest comes
    until = time.monotonic() + 5.0
    while came[0] == held_at and time.monotonic() < until:
        multi.perform()
        multi.select(0.05)
    assert came[0] > held_at
    multi.remove_handle(handle)
    handle.close()
