"""Failures as data (issue 19), end to end: the real CLI against the reference server, the
list of failures checked line by line against the server's own access log (what it was told
to fail, how often each file was asked for), never against what the client says."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path
from urllib.parse import quote

from getkit import STATE, assert_complete, command, expected_files, get, read_journal

from bulkfetch.testing import ReferenceServer

FILES = 300
# --retries 1: a 500/503 fails a file when both of its attempts get one
CLIENT = ("--retries", "1", "--max-retry-wait", "0.2")


def asked(server: ReferenceServer) -> dict[str, list[int]]:
    """name -> the status of every GET of it, in order, from the server's access log."""
    statuses: dict[str, list[int]] = defaultdict(list)
    for request in server.requests():
        if request.method == "GET" and request.target.startswith("/get/"):
            statuses[request.target.removeprefix("/get/")].append(request.status)
    return statuses


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().decode("utf-8").splitlines()]


def check_lines(lines: list[dict], server: ReferenceServer) -> None:
    """Exactly the files whose last answer was an error, each with its URL, that status and
    as many attempts as the server counted GETs (over every run on this DEST)."""
    failed = {name: statuses for name, statuses in asked(server).items()
              if statuses[-1] >= 400}
    names = [line["name"] for line in lines]
    assert names == sorted(failed), "one line per failed file, in listing order"
    for line in lines:
        statuses = failed[line["name"]]
        assert line == {"url": f"{server.url}/get/{line['name']}", "name": line["name"],
                        "reason": f"HTTP {statuses[-1]}", "attempts": len(statuses),
                        "status": statuses[-1]}, (line, statuses)


def test_the_list_is_what_the_server_failed_and_a_healed_retry_removes_it(
        tmp_path: Path) -> None:
    dest, report = tmp_path / "d", tmp_path / "run.json"
    listed = dest / STATE / "failures.jsonl"
    beside = tmp_path / "run.failures.jsonl"
    with ReferenceServer("--files", str(FILES), "--page-size", "100", "--deny-rate", "0.05",
                         "--fail-rate", "0.2", "--retry-after", "0", access_log=True) as server:
        # 1. no --report: the list is DEST's
        proc = subprocess.run(command(server.url, dest, *CLIENT), capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        assert str(listed) in "".join(proc.stderr.split())  # the summary names it
        first = lines_of(listed)
        check_lines(first, server)
        assert {line["status"] // 100 for line in first} == {4, 5}  # denied and failed
        assert {line["attempts"] for line in first} == {1, 2}
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # nothing beside
        # 2. --retry-failed --report: the files still failing, attempts added up, and a
        # copy beside the report, which names it
        proc, data = get(server.url, dest, report, *CLIENT, "--retry-failed", timeout=300)
        assert proc.returncode == 1, proc.stderr
        second = lines_of(listed)
        check_lines(second, server)
        assert 0 < len(second) < len(first) and data["files_failed"] == len(second)
        assert {line["name"] for line in second} < {line["name"] for line in first}
        assert data["failures_file"] == str(beside)
        assert beside.read_bytes() == listed.read_bytes()
        port = server.port
    # 3. the same server healed: the retry fetches every last file, and no list is left
    with ReferenceServer("--files", str(FILES), "--page-size", "100", "--port", str(port)
                         ) as healed:
        proc, data = get(healed.url, dest, report, *CLIENT, "--retry-failed", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert data["files_failed"] == 0 and data["failures_file"] is None
    assert not listed.exists() and not beside.exists()
    assert_complete(dest, expected_files(FILES))


def test_names_refused_before_any_transfer_are_listed_too(tmp_path: Path) -> None:
    dest = tmp_path / "d"
    with ReferenceServer("--files", "20", "--hostile-names") as server:
        proc, data = get(server.url, dest, tmp_path / "r.json", timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = lines_of(dest / STATE / "failures.jsonl")
    journaled = read_journal(dest, "SELECT name FROM failures")
    assert len(lines) == len(journaled) == data["files_failed"] > 0
    by_name = {line["name"]: line for line in lines}
    unsafe = [line for line in lines if line["reason"].startswith("unsafe name")]
    assert {"../x", "nul\x00byte", "bad-utf8-\udcff"} <= {line["name"] for line in unsafe}
    for line in unsafe:
        assert line["attempts"] == 0 and line["status"] is None
        try:  # the URL it would have been fetched from, when the name makes one
            url = f"{server.url}/get/{quote(line['name'], safe='/')}"
        except UnicodeEncodeError:
            url = None
        assert line["url"] == url, line
    assert by_name["bad-utf8-\udcff"]["url"] is None
