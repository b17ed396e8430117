"""`bulkfetch get --sink tar` end to end: shards and index under faults, kill -9 and reruns,
Ctrl-C, --restart and hostile names. The real CLI against the reference server."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from getkit import cli, command, dataset, expected_files, get, index_rows

from bulkfetch.testing import ReferenceServer

FAULTS = ("--fail-rate", "0.02", "--truncate-rate", "0.01", "--corrupt-rate", "0.01")


def shards_closed(dest: Path) -> int:
    return len(index_rows(dest, "SELECT id FROM shards"))


def assert_shards_exactly_once(dest: Path, expected: dict[str, str]) -> None:
    """The index holds each expected name once with its MD5; every shard is a valid tar
    holding exactly the members the index points into it, each once; nothing else."""
    rows = index_rows(dest, "SELECT m.name, s.file, m.offset, m.size, m.md5 "
                            "FROM members m JOIN shards s ON s.id = m.shard")
    assert len(rows) == len(expected), (len(rows), len(expected))
    indexed = {name: (file, offset, size, md5) for name, file, offset, size, md5 in rows}
    assert set(indexed) == set(expected), sorted(set(indexed) ^ set(expected))[:5]
    wrong = [n for n, (_, _, _, md5) in indexed.items() if md5 != expected[n]]
    assert not wrong, wrong[:5]
    files = {file for (file,) in index_rows(dest, "SELECT file FROM shards")}
    on_disk = {p.name for p in dest.iterdir() if p.name.startswith("shard-")}
    assert on_disk == files, on_disk ^ files  # no .part, no orphan shard
    seen = 0
    for file in sorted(files):
        with tarfile.open(dest / file) as tar:
            for member in tar:
                seen += 1
                data = tar.extractfile(member).read()
                shard, offset, size, md5 = indexed[member.name]
                assert (shard, offset, size) == (file, member.offset_data, member.size)
                assert hashlib.md5(data).hexdigest() == md5 == expected[member.name]
    assert seen == len(expected), f"{seen} members in the shards for {len(expected)} names"


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def wait_for_shards(dest: Path, proc: subprocess.Popen, count: int, what: str) -> None:
    deadline = time.monotonic() + 120
    while shards_closed(dest) < count:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_300k_files_into_tar_under_faults_and_three_kills(reference_server, tmp_path):
    files = 300_000
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    server = reference_server("--files", str(files), *FAULTS)
    dest = tmp_path / "dest"
    cmd = command(server.url, dest, "--sink", "tar", "--shard-files", "20000", "--quiet")
    for kill in range(3):
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            target = shards_closed(dest) + 1
            wait_for_shards(dest, proc, target, f"shard {target} (seed {seed})")
            time.sleep(rng.uniform(0.0, 1.0))
            assert proc.poll() is None, f"seed {seed}: finished before kill {kill + 1}"
        finally:
            kill_group(proc, signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err
    proc, report = get(server.url, dest, tmp_path / "r.json", "--sink", "tar",
                       "--shard-files", "20000", "--quiet", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == files and report["files_failed"] == 0
    assert 0 < report["resumed_files"] < files
    assert_shards_exactly_once(dest, expected_files(files))
    assert os.listdir(dest / ".bulkfetch" / "tmp") == []
    # reading back: ls lists every name once; cat returns the very bytes served
    listed = cli("ls", str(dest))
    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.splitlines()) == sorted(expected_files(files))
    data = dataset(files)
    picks = sorted(rng.sample(range(files), 40))
    shown = subprocess.run([sys.executable, "-m", "bulkfetch", "cat", str(dest),
                            *(data.name(i) for i in picks)], capture_output=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == b"".join(data.body(i) for i in picks)


def test_ctrl_c_closes_the_shard_with_the_pages_in_hand(reference_server, tmp_path):
    files = 20_000
    # 20 ms a file: the run takes seconds, so the interrupt a second in always finds work left
    server = reference_server("--files", str(files), "--page-size", "100", "--latency", "20")
    dest = tmp_path / "dest"
    cmd = command(server.url, dest, "--sink", "tar", "--quiet")
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(dest.glob("shard-*.tar.part")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert proc.poll() is None, "finished before the interrupt"
        kill_group(proc, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc, signal.SIGKILL)
    assert proc.returncode == 130, err
    # the graceful stop finished the pages in hand and closed every shard
    assert not list(dest.glob("shard-*.tar.part"))
    interrupted = index_rows(dest, "SELECT count(*) FROM members")[0][0]
    assert 0 < interrupted < files and interrupted % 100 == 0
    proc2, report = get(server.url, dest, tmp_path / "r.json", "--sink", "tar", "--quiet")
    assert proc2.returncode == 0, proc2.stderr
    assert report["resumed_files"] == interrupted
    assert_shards_exactly_once(dest, expected_files(files))


def test_restart_replaces_the_shards(reference_server: ReferenceServer, tmp_path: Path) -> None:
    server = reference_server("--files", "3000")
    dest = tmp_path / "dest"
    for extra in ((), ("--restart",)):
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sink", "tar",
                           "--shard-files", "1000", "--quiet", *extra)
        assert proc.returncode == 0, proc.stderr
        assert report["files_ok"] == 3000 and report["resumed_files"] == 0
    assert_shards_exactly_once(dest, expected_files(3000))


def test_tar_options_are_checked(reference_server, tmp_path: Path) -> None:
    server = reference_server("--files", "10")
    for extra, message in ((("--fanout", "2"), "--fanout applies to --sink dir"),
                           (("--shard-size", "lots"), "--shard-size")):
        proc, report = get(server.url, tmp_path / "d", tmp_path / "r.json", "--sink", "tar",
                           *extra)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert report == {}


def test_hostile_names_never_become_members(reference_server, tmp_path: Path) -> None:
    server = reference_server("--files", "50", "--hostile-names")
    dest = tmp_path / "dest"
    proc, report = get(server.url, dest, tmp_path / "r.json", "--sink", "tar", "--quiet")
    assert proc.returncode == 1, proc.stderr
    refused = {f["name"] for f in report["failures"]}
    assert "../evil" in refused or any(".." in name for name in refused)
    names = [name for (name,) in index_rows(dest, "SELECT name FROM members")]
    assert len(names) == report["files_ok"] and names
    for shard in dest.glob("shard-*.tar"):
        with tarfile.open(shard) as tar:
            for member in tar:
                assert member.isfile()
                assert not member.name.startswith(("/", "~")) and ".." not in member.name.split("/")
                assert member.name not in refused
    assert sorted(os.listdir(tmp_path)) == ["dest", "r.failures.jsonl", "r.json"]


def test_retry_failed_adds_the_failed_files_once(reference_server, tmp_path: Path) -> None:
    files = 5000
    server = reference_server("--files", str(files), "--fail-rate", "0.05")
    dest = tmp_path / "dest"
    first, report = get(server.url, dest, tmp_path / "r1.json", "--sink", "tar", "--retries",
                        "0", "--quiet")
    assert first.returncode == 1, first.stderr
    assert 0 < report["files_failed"] < files // 5
    assert len(index_rows(dest, "SELECT name FROM members")) == report["files_ok"]
    second, report = get(server.url, dest, tmp_path / "r2.json", "--sink", "tar",
                         "--retries", "5", "--retry-failed", "--quiet")
    assert second.returncode == 0, second.stderr
    assert report["files_ok"] == files and report["files_failed"] == 0
    assert_shards_exactly_once(dest, expected_files(files))
