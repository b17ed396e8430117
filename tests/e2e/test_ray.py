"""`bulkfetch get --runner ray` on a real two-node Ray cluster on this machine (one cluster for
the module: a head and a worker node of one CPU each, started by ray.cluster_utils): faults of
the reference server, an actor killed, a node removed, the driver killed with -9. What DEST
holds is checked with tarfile, the index and the data set's MD5s."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from getkit import (
    assert_complete,
    assert_tar_exactly_once,
    expected_files,
    read_journal,
)
from sshfs_kit import sshfs_mount

from bulkfetch.testing import ReferenceServer

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

Start = Callable[..., ReferenceServer]
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
NODE = {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024}
NAME = re.compile(r"/get/f(\d{10})")


class TwoNodes:
    def __init__(self) -> None:
        self.cluster = cluster_utils.Cluster(initialize_head=True, head_node_args=dict(NODE))
        self.worker_node = self.cluster.add_node(**NODE)
        self.cluster.wait_for_nodes()

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def ensure_two(self) -> None:
        """A test that removed the worker node leaves the next one two nodes again."""
        if self.worker_node not in self.cluster.worker_nodes:
            self.worker_node = self.cluster.add_node(**NODE)
            self.cluster.wait_for_nodes()


@pytest.fixture(scope="module")
def cluster() -> Iterator[TwoNodes]:
    saved = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ.update(RAY_ENV)
    nodes = TwoNodes()
    try:
        yield nodes
    finally:
        nodes.cluster.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def ray_get(cluster: TwoNodes, url: str, dest: Path, report: Path,
            *extra: str) -> list[str]:
    return [sys.executable, "-m", "bulkfetch", "get", url, str(dest), "--runner", "ray",
            "--ray-address", cluster.address, "--report", str(report), "--plain", *extra]


def run_to_end(args: list[str], timeout: float = 300, cwd: Path | None = None
               ) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = Path(cwd or ".") / args[args.index("--report") + 1]
    return proc, json.loads(report.read_text()) if report.exists() else {}


def nodes_that_worked(report: dict) -> set[str]:
    return {str(worker["node"]) for worker in report["workers"] if worker["files_ok"] > 0}


def actor_pids() -> list[int]:
    found = subprocess.run(["pgrep", "-f", "ray::RayWorker"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def pages_done(dest: Path) -> int:
    with contextlib.suppress(Exception):
        return int(read_journal(dest, "SELECT count(*) FROM pages WHERE status = 'done'")
                   [0][0])
    return 0


def wait_for_pages(proc: subprocess.Popen, dest: Path, pages: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while pages_done(dest) < pages:
        assert proc.poll() is None, f"the run ended before {pages} pages were done"
        assert time.monotonic() < deadline, f"{pages} pages not done in {timeout:g} s"
        time.sleep(0.05)


def test_without_ray_the_runner_says_how_to_get_it(tmp_path: Path) -> None:
    blocked = ("import sys; sys.modules['ray'] = None; sys.argv[0] = 'bulkfetch'; "
               "from bulkfetch.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", blocked, "get", "http://127.0.0.1:9/",
                           str(tmp_path / "dest"), "--runner", "ray"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'bulkfetch[ray]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ray_address_without_the_ray_runner_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", "http://127.0.0.1:9/",
                           str(tmp_path / "dest"), "--ray-address", "auto"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--ray-address is for --runner ray" in proc.stderr


def shards(sink: str, files: int) -> tuple[str, ...]:
    """--shard-files for a tar run (a directory run refuses it: it does nothing there)."""
    return ("--shard-files", str(files)) if sink == "tar" else ()


@pytest.mark.parametrize("sink", ["tar", "dir"])
def test_faults_every_file_exactly_once_with_work_on_both_nodes(
        cluster: TwoNodes, reference_server: Start, tmp_path: Path, sink: str) -> None:
    cluster.ensure_two()
    files = 20_000
    server = reference_server("--files", str(files), "--page-size", "500",
                              "--fail-rate", "0.02", "--reset-rate", "0.01")
    dest = tmp_path / "dest"
    # DEST relative to this directory: the actors' working directory is another
    proc, report = run_to_end(ray_get(cluster, server.url, Path("dest"), Path("r.json"),
                                      "--sink", sink, *shards(sink, 3000), "-c", "256"),
                              cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["files_ok"] == files and report["retries"] > 0
    assert len(nodes_that_worked(report)) == 2, report["workers"]
    assert sum(worker["files_ok"] for worker in report["workers"]) == files
    assert "workers" in proc.stderr and "node" in proc.stderr  # the summary says where
    if sink == "tar":
        assert_tar_exactly_once(dest, files)
        # shards are named by worker: both workers wrote their own
        assert {shard.name[6:9] for shard in dest.glob("shard-*.tar")} == {"000", "001"}
    else:
        assert_complete(dest, expected_files(files))


def fault_mid_run(cluster: TwoNodes, server: ReferenceServer, tmp_path: Path, sink: str,
                  fault: Callable[[], None], *extra: str) -> tuple[dict, str]:
    """Run `get --runner ray` (-c 32), cause `fault` once 10 pages are done, and return the
    report and stderr of a run that must end with exit 0."""
    dest = tmp_path / "dest"
    args = ray_get(cluster, server.url, dest, tmp_path / "r.json", "--sink", sink,
                   *shards(sink, 4000), "-c", "32", *extra)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_pages(proc, dest, 10)
        fault()
        _, err = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return json.loads((tmp_path / "r.json").read_text()), err


def test_a_killed_actor_s_pages_go_to_the_others(
        cluster: TwoNodes, reference_server: Start, tmp_path: Path) -> None:
    cluster.ensure_two()
    files = 60_000
    server = reference_server("--files", str(files), "--page-size", "500", "--latency", "2")

    def kill_an_actor() -> None:
        victims = actor_pids()
        assert len(victims) == 2, victims
        os.kill(victims[0], signal.SIGKILL)

    report, err = fault_mid_run(cluster, server, tmp_path, "tar", kill_an_actor)
    assert report["pages_reassigned"] > 0
    assert [w for w in report["workers"] if w["lost"]], report["workers"]
    # a replacement's node is looked up at the end: every worker that worked has one
    assert all(" node " in w["node"] for w in report["workers"] if w["files_ok"]), \
        report["workers"]
    assert "lost" in err and "of its pages go to the others" in err
    assert report["files_ok"] == files
    assert_tar_exactly_once(tmp_path / "dest", files)


@pytest.mark.parametrize("sink", ["tar", "dir"])
def test_a_frozen_actor_s_lease_lapses_and_its_pages_go_to_the_others(
        cluster: TwoNodes, reference_server: Start, tmp_path: Path, sink: str) -> None:
    """SIGSTOP: alive to Ray, silent to the driver (a GC pause, a hung mount). Without a
    lease the run waited for it as long as it stayed stopped."""
    cluster.ensure_two()
    files, lease = 60_000, 4
    server = reference_server("--files", str(files), "--page-size", "500", "--latency", "2")
    frozen: list[int] = []

    def freeze_an_actor() -> None:
        victims = actor_pids()
        assert len(victims) == 2, victims
        os.kill(victims[0], signal.SIGSTOP)
        frozen.append(victims[0])

    started = time.monotonic()
    try:
        report, err = fault_mid_run(cluster, server, tmp_path, sink, freeze_an_actor,
                                    "--lease", str(lease))
    finally:
        for pid in frozen:  # (killed by then: nothing to wake)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    took = time.monotonic() - started
    assert report["leases_lapsed"] == 1 and report["pages_reassigned"] > 0, report
    lost = [w["lost"] for w in report["workers"] if w["lost"]]
    assert len(lost) == 1 and "--lease" in lost[0], report["workers"]
    assert "silent past --lease" in err
    assert report["files_ok"] == files
    if sink == "tar":
        assert_tar_exactly_once(tmp_path / "dest", files)
    else:
        assert_complete(tmp_path / "dest", expected_files(files))
    assert took < 120, took  # seconds of lease, not as long as the stop lasts


def test_the_driver_killed_with_9_resumes_without_fetching_done_pages(
        cluster: TwoNodes, reference_server: Start, tmp_path: Path) -> None:
    cluster.ensure_two()
    files, page_size = 40_000, 500
    server = reference_server("--files", str(files), "--page-size", str(page_size),
                              "--latency", "2", access_log=True)
    dest = tmp_path / "dest"
    args = ray_get(cluster, server.url, dest, tmp_path / "r.json", "--sink", "tar",
                   "--shard-files", "2000", "-c", "16")
    proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for_pages(proc, dest, 8)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = {seq for (seq,) in read_journal(dest, "SELECT seq FROM pages WHERE status='done'")}
    assert done
    deadline = time.monotonic() + 60  # Ray ends the actors of a driver that died
    while actor_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not actor_pids(), "the dead driver's actors still run"
    rerun_began = time.time()
    rerun, report = run_to_end(args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert report["resumed_files"] > 0
    again = [r.target for r in server.requests()
             if r.time >= rerun_began and (m := NAME.fullmatch(r.target))
             and int(m.group(1)) // page_size in done]
    assert not again, again[:5]
    assert_tar_exactly_once(dest, files)


def test_a_removed_node_s_pages_go_to_the_others(
        cluster: TwoNodes, reference_server: Start, tmp_path: Path) -> None:
    cluster.ensure_two()
    files = 40_000
    server = reference_server("--files", str(files), "--page-size", "500", "--latency", "2")
    report, _ = fault_mid_run(cluster, server, tmp_path, "dir", lambda: cluster.cluster.remove_node(
        cluster.worker_node, allow_graceful=False))
    assert report["pages_reassigned"] > 0
    assert len([w for w in report["workers"] if w["lost"]]) == 1, report["workers"]
    assert report["files_ok"] == files
    assert_complete(tmp_path / "dest", expected_files(files))


def _same_mounts_as_us() -> str:
    return os.readlink("/proc/self/ns/mnt")


def _processes_in_other_mounts(mounts: str) -> list[int]:
    """Ray processes whose mount namespace is not ours (the blind node's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (os.readlink(f"/proc/{entry}/ns/mnt") != mounts
                    and any(mark in Path(f"/proc/{entry}/cmdline").read_text(errors="replace")
                            for mark in ("raylet", "ray::", "/ray/"))):
                found.append(int(entry))
    return found


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a node with its own mounts needs root and unshare")
def test_a_node_that_does_not_see_dest_is_refused_by_name(
        cluster: TwoNodes, tmp_path: Path) -> None:
    # Last in the module: a third node, in a mount namespace where DEST's directory is an
    # empty tmpfs of its own, joins the cluster; the run must refuse before any worker starts.
    shared = tmp_path / "shared"
    shared.mkdir()
    mounts = _same_mounts_as_us()
    ray_start = shutil.which("ray") or "ray"
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                    f"mount -t tmpfs none {shared} && {ray_start} start --address="
                    f"{cluster.address} --num-cpus=0 --object-store-memory=80000000 "
                    "--node-ip-address=127.0.0.1"],
                   check=True, capture_output=True, timeout=120, env=os.environ | RAY_ENV)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", "http://127.0.0.1:9/",
             str(shared / "dest"), "--runner", "ray", "--ray-address", cluster.address],
            capture_output=True, text=True, timeout=180)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "is not seen by every Ray node (not by " in proc.stderr, proc.stderr[-3000:]
        assert "shared filesystem" in proc.stderr and "Traceback" not in proc.stderr
        assert not actor_pids()  # refused before any worker started
    finally:
        for pid in _processes_in_other_mounts(mounts):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_dest_on_a_fuse_network_filesystem(
        cluster: TwoNodes, reference_server: Start, tmp_path: Path) -> None:
    """DEST on sshfs over loopback (no NFS client in this kernel; FUSE it has): the journal
    and the tar index are SQLite there, their locks the kernel's on the one mount every
    actor of this machine's two nodes shares, and renames OpenSSH's posix-rename."""
    cluster.ensure_two()
    files = 20_000
    server = reference_server("--files", str(files), "--page-size", "500",
                              "--fail-rate", "0.01")
    home = tmp_path / "sshfs"
    home.mkdir()
    with sshfs_mount(home) as (export, mount):
        dest = mount / "dest"
        proc, report = run_to_end(ray_get(cluster, server.url, dest, tmp_path / "r.json",
                                          "--sink", "tar", *shards("tar", 3000)))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert report["files_ok"] == files and len(nodes_that_worked(report)) == 2, report
        # the index's locks hold on this mount: a second writer is refused while one writes
        first = sqlite3.connect(dest / "index.sqlite", isolation_level=None, timeout=0)
        second = sqlite3.connect(dest / "index.sqlite", isolation_level=None, timeout=0)
        try:
            first.execute("BEGIN IMMEDIATE")
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                second.execute("BEGIN IMMEDIATE")
            first.execute("ROLLBACK")
        finally:
            first.close()
            second.close()
        assert_tar_exactly_once(export / "dest", files)  # as the file server holds it
