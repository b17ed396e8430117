"""Failures as data (issue 19): DEST/.bulkfetch/failures.jsonl lists every file failed at the
end of a run (url, name, reason, attempts, status), and a run that fixes them removes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bulkfetch.testing import ReferenceServer

FILES = 400


def run(url: str, dest: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = dest.parent / "r.json"
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", url, str(dest), "-w", "2",
                           "--retries", "1", "--report", str(report), *extra],
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(report.read_text())


def test_every_failure_is_a_json_line_and_a_healed_rerun_removes_the_list(
        tmp_path: Path) -> None:
    dest = tmp_path / "d"
    with ReferenceServer("--files", str(FILES), "--deny-rate", "0.05",
                         access_log=True) as server:
        proc, report = run(server.url, dest)
        denied = {r.target.removeprefix("/get/"): r.status for r in server.requests()
                  if r.target.startswith("/get/") and r.status >= 400}
    assert proc.returncode == 1, proc.stderr
    path = dest / ".bulkfetch" / "failures.jsonl"
    assert report["failures_file"] == str(path)
    printed = "".join((proc.stdout + proc.stderr).split())  # the terminal wraps long lines
    assert str(path) in printed  # the summary says where the list is
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == report["files_failed"] == len(denied) > 0
    for line in lines:
        assert line["url"] == f"{server.url}/get/{line['name']}"
        assert line["status"] == denied[line["name"]] and line["reason"].startswith("HTTP ")
        assert line["attempts"] >= 1
    # the same server without the denials: --retry-failed fetches them, the list goes
    with ReferenceServer("--files", str(FILES), "--port", str(server.port)) as healed:
        proc, report = run(healed.url, dest, "--retry-failed")
    assert proc.returncode == 0, proc.stderr
    assert report["files_failed"] == 0 and report["failures_file"] is None
    assert not path.exists()
