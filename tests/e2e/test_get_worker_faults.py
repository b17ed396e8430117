"""A local worker process that freezes or is killed mid-run (runners/pool.py): the real CLI
against the reference server, and a worker stopped with SIGSTOP (a hung mount, a debugger)
or killed with SIGKILL (the OOM killer). The run ends complete, each file exactly once,
having lost about a lease, not the run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from getkit import (
    assert_complete,
    assert_tar_exactly_once,
    command,
    expected_files,
    read_journal,
)
from sshfs_kit import sshfs_mount

from bulkfetch.sinks.base import SinkFatal
from bulkfetch.sinks.directory import TMP_DIR, DirectorySink, fence
from bulkfetch.testing import ReferenceServer

Start = Callable[..., ReferenceServer]
FILES, LEASE = 30_000, 3
SHARDS = {"tar": ("--shard-files", "2000")}  # pages are done when their shard is indexed


def pages_done(dest: Path) -> int:
    with contextlib.suppress(Exception):
        return int(read_journal(dest, "SELECT count(*) FROM pages WHERE status = 'done'")[0][0])
    return 0


def worker_pids(run: subprocess.Popen[str]) -> list[int]:
    """The run's worker processes: its children (forked; the listing runs in threads)."""
    found = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def fault_mid_run(server: ReferenceServer, dest: Path, report: Path, sink: str,
                  fault: signal.Signals) -> tuple[dict, str, float]:
    """Run get with two workers; once 4 pages are done, send `fault` to one worker. (the
    report, stderr, seconds from the fault to the run's end)."""
    run = subprocess.Popen(
        command(server.url, dest, "--report", str(report), "--sink", sink,
                "--lease", str(LEASE), "-c", "16", *SHARDS.get(sink, ())),
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victims: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while pages_done(dest) < 4:
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no 4 pages done within 60 s"
            time.sleep(0.01)
        workers = worker_pids(run)
        assert len(workers) == 2, workers
        victims.append(workers[0])
        os.kill(workers[0], fault)
        hit = time.monotonic()
        _, err = run.communicate(timeout=120)  # without a lease: as long as the stop lasts
        took = time.monotonic() - hit
    finally:
        for pid in victims:  # (killed by then: nothing to wake)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return json.loads(report.read_text()), err, took


@pytest.mark.parametrize("sink", ["tar", "dir"])
def test_a_stopped_worker_costs_a_lease_not_the_run(
        reference_server: Start, tmp_path: Path, sink: str) -> None:
    server = reference_server("--files", str(FILES), "--page-size", "500", "--latency", "2")
    dest = tmp_path / "dest"
    report, err, took = fault_mid_run(server, dest, tmp_path / "r.json", sink,
                                      signal.SIGSTOP)
    assert report["leases_lapsed"] == 1 and report["pages_reassigned"] > 0, report
    lost = [worker["lost"] for worker in report["workers"] if worker["lost"]]
    assert len(lost) == 1 and "--lease" in lost[0], report["workers"]
    assert "1 worker lost (1 silent past --lease)" in err and "of its pages" in err
    assert report["files_ok"] == FILES
    if sink == "tar":
        assert_tar_exactly_once(dest, FILES)
    else:
        assert_complete(dest, expected_files(FILES))
    # a lease, then the rest of the work (a few seconds at most), not the stop's length
    assert took < LEASE + 30, took


def test_a_worker_killed_by_the_oom_killer_is_replaced_and_the_run_completes(
        reference_server: Start, tmp_path: Path) -> None:
    server = reference_server("--files", str(FILES), "--page-size", "500", "--latency", "2")
    dest = tmp_path / "dest"
    report, err, _ = fault_mid_run(server, dest, tmp_path / "r.json", "tar", signal.SIGKILL)
    assert report["leases_lapsed"] == 0, report
    lost = [worker["lost"] for worker in report["workers"] if worker["lost"]]
    assert len(lost) == 1 and "signal 9" in lost[0], report["workers"]
    assert "of its pages go to the others" in err and "1 worker lost;" in err
    assert report["files_ok"] == FILES
    assert_tar_exactly_once(dest, FILES)


def test_the_dir_sink_s_fence_holds_on_a_fuse_network_filesystem(tmp_path: Path) -> None:
    """docs/scale.md: a removed directory takes no new entry. On sshfs (FUSE, paths sent
    to the server) as on ext4: a worker fenced off stores nothing more."""
    with sshfs_mount(tmp_path) as (export, mount):
        dest = mount / "dest"
        (dest / TMP_DIR).mkdir(parents=True)
        sink = DirectorySink(dest, 3)
        try:
            sink.write("before", b"stored before the fence")
            fence(dest, 3)
            with pytest.raises(SinkFatal, match="given up for lost"):
                sink.write("after", b"written after the fence")
        finally:
            sink.close()
        assert sorted(os.listdir(export / "dest")) == [".bulkfetch", "before"]
