"""The default concurrency's second tries and memory against the reference server: requests
the server never answers are hedged on another connection instead of waiting out the idle
timeout, and a run resumed after Ctrl-C starts near the limit the former run had reached."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from getkit import assert_complete, expected_files, read_journal


def get(url: str, dest: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = dest.parent / f"{dest.name}.json"
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", url, str(dest),
                           "--quiet", "--report", str(report), *args],
                          capture_output=True, text=True, timeout=240)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(report.read_text()) if report.exists() else {}


def test_silent_requests_are_hedged_not_waited_out(reference_server, tmp_path: Path) -> None:
    """One request in a hundred is read and never answered, its connection left open. Each
    would hold the run for --idle-timeout (60 s here) and come back as a retry; hedged, the
    second request's answer wins and no transfer times out."""
    files = 3000
    server = reference_server("--files", str(files), "--stall-rate", "0.01")
    proc, report = get(server.url, tmp_path / "d", "-w", "1", "--idle-timeout", "60")
    assert proc.returncode == 0, proc.stderr
    assert_complete(tmp_path / "d", expected_files(files))
    assert report["files_ok"] == files
    assert report["hedged"]["sent"] > 0 and report["hedged"]["won"] > 0, report["hedged"]
    assert report["retries"] == 0, report  # none waited out the idle timeout


def test_fixed_concurrency_sends_no_hedges(reference_server, tmp_path: Path) -> None:
    """A fixed -c is the user's word: no second requests beside it. The silent requests
    that auto would hedge wait out the idle timeout and are retried instead."""
    server = reference_server("--files", "500", "--stall-rate", "0.02")
    proc, report = get(server.url, tmp_path / "d", "-w", "1", "-c", "8", "--idle-timeout", "1")
    assert proc.returncode == 0, proc.stderr
    assert report["hedged"] == {"sent": 0, "won": 0}
    assert report["retries"] > 0, report  # the server did leave some silent


def test_a_resumed_run_starts_near_what_the_host_took(reference_server,
                                                     tmp_path: Path) -> None:
    """A far server (100 ms an answer) lets the limit grow well past its gentle start; the
    run is stopped as Ctrl-C does, and the resumed run starts from what was learned."""
    server = reference_server("--files", "30000", "--latency", "100")
    dest = tmp_path / "d"
    run = subprocess.Popen([sys.executable, "-m", "bulkfetch", "get", server.url, str(dest),
                            "--quiet", "-w", "1"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not read_journal(dest, "SELECT 1 FROM pages WHERE status = 'done' LIMIT 1 OFFSET 4"):
        assert run.poll() is None, run.stderr.read()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no five pages done in 120 s"
        time.sleep(0.1)
    time.sleep(1.5)  # the workers tell what they learned once a second
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) != 0  # interrupted: the rerun resumes
    learned = read_journal(dest, "SELECT host, per_worker, latency_floor FROM host_memory")
    assert len(learned) == 1, learned
    host, limit, floor = learned[0]
    assert host == f"http://127.0.0.1:{server.port}", learned
    assert limit > 16 and floor >= 0.09, learned

    proc, report = get(server.url, dest, "-w", "1")
    assert proc.returncode == 0, proc.stderr
    assert report["options"]["limits"]["remembered"] == [[host, limit, floor]]
    assert report["concurrency"]["peak"] >= limit, report["concurrency"]
