"""`--concurrency auto` against the reference server: a far server (every answer 100 ms
late) makes it raise the limit above its start, --max-concurrency bounds it, 429s and a
server's cap on requests in flight bring it down, and the report says what it found. Over
two hosts, a capped one's pushback lowers its own limit only."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from getkit import assert_complete, expected_files

from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.util.sizes import parse_size_spec


def get(url: str, dest: Path, *args: str, table: Path | None = None) -> dict:
    """`get URL DEST ARGS`; with `table`, `get --from-file TABLE DEST ARGS` (url: the flag)."""
    report = dest.parent / f"{dest.name}.json"
    source = [url, str(table)] if table is not None else [url]
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", *source, str(dest),
                           "--quiet", "--report", str(report), *args],
                          capture_output=True, text=True, timeout=240)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return json.loads(report.read_text())


def test_a_far_server_gets_more_in_flight(reference_server, tmp_path: Path) -> None:
    files = 4000
    server = reference_server("--files", str(files), "--latency", "100")
    report = get(server.url, tmp_path / "auto", "-c", "auto", "-w", "1")
    assert_complete(tmp_path / "auto", expected_files(files))
    assert report["concurrency"]["peak"] >= 128, report["concurrency"]
    assert report["options"]["limits"]["adaptive"] is True
    bounded = get(server.url, tmp_path / "bounded", "-c", "auto", "-w", "1",
                  "--max-concurrency", "100")
    assert 64 <= bounded["concurrency"]["peak"] <= 100, bounded["concurrency"]
    fixed = get(server.url, tmp_path / "fixed", "-c", "32", "-w", "2", "--sink", "null")
    assert fixed["concurrency"] == {"final": 64, "peak": 64}


def test_throttling_brings_the_limit_down(reference_server, tmp_path: Path) -> None:
    files = 1500
    server = reference_server("--files", str(files), "--latency", "20", "--throttle-rate",
                              "0.2", "--retry-after", "0")
    report = get(server.url, tmp_path / "d", "-c", "auto", "-w", "1", "--sink", "null")
    assert report["files_ok"] == files and report["retries"] > 0
    assert report["concurrency"]["final"] < 64, report["concurrency"]


def test_a_capped_server_brings_the_limit_down(reference_server, tmp_path: Path) -> None:
    """Refusals that grow with the load (more than 24 in flight: 503) move the limit."""
    files = 3000
    server = reference_server("--files", str(files), "--latency", "20", "--max-concurrent",
                              "24", access_log=True)
    report = get(server.url, tmp_path / "d", "-c", "auto", "-w", "1", "--sink", "null")
    assert report["files_ok"] == files and report["retries"] > 0
    assert report["concurrency"]["final"] <= 40, report["concurrency"]
    # a fixed 64 against a cap of 24 would be refused about 1.7 times a file
    refused = sum(1 for r in server.requests() if r.status == 503)
    assert refused < files, refused


def test_a_capped_host_does_not_hold_back_its_neighbour(reference_server,
                                                      tmp_path: Path) -> None:
    """One URL table over a capped host (more than 8 in flight: 503 with Retry-After: 1)
    and a far one. With one limit for the worker, the capped host's refusals brought it
    down to its floor and the far host with it (the run took minutes, most answers 503);
    each host's own limit keeps the refusals few and the worker's pool wide."""
    capped_files, far_files = 600, 3000
    capped = reference_server("--files", str(capped_files), "--latency", "20",
                              "--max-concurrent", "8", access_log=True)
    far = reference_server("--files", str(far_files), "--latency", "50")
    expected = {**{f"capped/{n}": md5 for n, md5 in expected_files(capped_files).items()},
                **{f"far/{n}": md5 for n, md5 in expected_files(far_files).items()}}
    rows = sorted([(i / capped_files, f"{capped.url}/get/{n}", f"capped/{n}")
                   for i, n in enumerate(expected_files(capped_files))]
                  + [(i / far_files, f"{far.url}/get/{n}", f"far/{n}")
                     for i, n in enumerate(expected_files(far_files))])
    table = tmp_path / "urls.csv"
    with table.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["url", "name"])
        writer.writerows(row[1:] for row in rows)
    report = get("--from-file", tmp_path / "d", "-w", "1", "--name-col", "name",
                 "-c", "auto", table=table)
    assert_complete(tmp_path / "d", expected)
    assert report["files_ok"] == capped_files + far_files
    refused = sum(1 for r in capped.requests() if r.status == 503)
    assert refused < capped_files // 10, refused
    # the worker's pool grew from its gentle start well past the capped host's 8
    assert report["concurrency"]["final"] >= 24, report["concurrency"]


def test_big_bodies_from_two_hosts_leave_each_hosts_window(reference_server,
                                                           tmp_path: Path) -> None:
    """Bodies over --spool-above from two hosts: each big transfer's start counted for its
    host's window, its end did not, so a host was full for good once as many big bodies
    as its limit had come, and the run hung (2 x 200 and 2 x 400 bodies of 1.1 MB: not
    done in 60 s; 2 x 100 came through)."""
    files = 200
    hosts = {label: reference_server("--files", str(files), "--file-size", "1100k")
             for label in ("a", "b")}
    data = SyntheticDataSet(files, 1000, 0, parse_size_spec("1100k"))
    bodies = {data.name(i): hashlib.md5(data.body(i)).hexdigest() for i in range(files)}
    expected = {f"{label}/{n}": md5 for label in hosts for n, md5 in bodies.items()}
    table = tmp_path / "urls.csv"
    with table.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["url", "name"])
        writer.writerows([f"{server.url}/get/{n}", f"{label}/{n}"]
                         for n in bodies for label, server in hosts.items())
    report = get("--from-file", tmp_path / "d", "-w", "1", "--name-col", "name",
                 "-c", "auto", table=table)
    assert_complete(tmp_path / "d", expected)
    assert report["files_ok"] == 2 * files


def test_a_bad_concurrency_is_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", "http://127.0.0.1:9",
                           str(tmp_path / "d"), "-c", "lots"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "'lots'" in proc.stderr and "auto" in proc.stderr
    assert not (tmp_path / "d").exists()
