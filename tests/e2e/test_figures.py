"""Figures that add up: the live line counts big bodies as they stream, an interrupted run's
summary says what it kept in partial files and which pages were under way, and the last
line of the display gives the summary's rate."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from bulkfetch.testing import ReferenceServer

# A status line of the plain display: "[00:00:05] 0 files 241.2 MB  ..."
STATUS = re.compile(r"^\[\d\d:\d\d:\d\d\] (?:final: )?[\d,]+ files (?:\([^)]*\) )?(\S+ \S+) ")
SIZE = re.compile(r"^([\d.]+) (bytes|kB|MB|GB)$")
UNITS = {"bytes": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def size_of(text: str) -> float:
    found = SIZE.match(text)
    assert found, text
    return float(found.group(1)) * UNITS[found.group(2)]


def test_an_interrupted_download_of_big_files_counts_what_streamed_and_what_it_kept(
        tmp_path: Path) -> None:
    """2 x 300 MB over 8 connections each paced to 5 MB/s: the 5-second status line shows
    the bytes on their way (it read "0 bytes" while 660 MB were in flight); after Ctrl-C
    the summary and the report say what the partial files keep and that two pages were
    under way."""
    with ReferenceServer("--files", "2", "--page-size", "1", "--file-size", "300m",
                         "--bandwidth-per-connection", "5m") as server:
        report = tmp_path / "report.json"
        run = subprocess.Popen(
            [sys.executable, "-m", "bulkfetch", "get", server.url, str(tmp_path / "d"),
             "--plain", "--report", str(report)], stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert run.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = run.stderr.readline()
            assert line, "the run ended before its first status line: " + "".join(lines)
            lines.append(line)
            if STATUS.match(line):
                break
        os.killpg(run.pid, signal.SIGINT)
        _, rest = run.communicate(timeout=60)
    lines.append(rest)
    out = "".join(lines)
    assert run.returncode == 130, out
    status = next(STATUS.match(line) for line in lines if STATUS.match(line))
    assert size_of(status.group(1)) > 20e6, status.group(0)  # (5 s at 8 x 5 MB/s: 200 MB)
    kept = json.loads(report.read_text())
    assert kept["partial"]["files"] == 2 and kept["partial"]["bytes"] > 20e6, kept["partial"]
    assert kept["pages"] == 0 and kept["pages_listed"] == 2
    flat = " ".join(out.split())
    assert "in 2 partial files (DEST/.bulkfetch/partial): the rerun asks only for the rest" \
        in flat, out
    assert "2 under way (a rerun finishes them)" in flat, out


def test_the_last_line_of_the_display_gives_the_rate_the_summary_gives(tmp_path: Path) -> None:
    with ReferenceServer("--files", "40", "--file-size", "4m") as server:
        run = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", server.url, str(tmp_path / "d"),
             "--plain"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    final = next(line for line in run.stderr.splitlines() if "final:" in line)
    rate = re.search(r"(\S+ \S+)/s avg\s*pages", final)
    assert rate, final
    summary = re.search(r"rate\s+[\d,]+ files/s · (\S+ \S+)/s", run.stderr)
    assert summary, run.stderr
    assert rate.group(1) == summary.group(1), (final, summary.group(0))
