"""`bulkfetch get` end to end: the real CLI in a subprocess against the reference server over
loopback. Every file is checked against the synthetic data set's formula (the server's ETag
is the MD5 of the same body), never against what the client reports."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import tarfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from getkit import (
    STATE,
    assert_complete,
    assert_state_clean,
    cli,
    expected_files,
    get,
    stored_files,
)

import bulkfetch.api
from bulkfetch.models import Progress
from bulkfetch.testing import ReferenceServer

Start = Callable[..., ReferenceServer]


# -- 1. 100,000 files through every transient fault ------------------------------------------
def test_100k_files_through_faults(reference_server: Start, tmp_path: Path) -> None:
    files = 100_000
    server = reference_server(
        "--files", str(files), "--fail-rate", "0.02", "--throttle-rate", "0.01",
        "--truncate-rate", "0.01", "--corrupt-rate", "0.01", "--reset-rate", "0.01",
        access_log=True)
    dest = tmp_path / "dest"
    proc, report = get(server.url, dest, tmp_path / "r.json", "--quiet", timeout=280)

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["exit_code"] == 0 and report["error"] is None and report["listing_complete"]
    assert report["files_ok"] == files and report["files_failed"] == 0
    assert report["failures"] == [] and report["bytes"] == 100 * files
    assert report["retries"] > 0
    assert_complete(dest, expected_files(files))
    # every kind of fault really happened, and each was retried into a good answer
    rows = [r for r in server.requests() if r.target.startswith("/get/")]
    faults = Counter(r.fault for r in rows)
    for kind in ("fail", "throttle", "truncate", "corrupt", "reset"):
        assert faults[kind] > 100, faults
    # Each fault costs one retry, except that libcurl itself re-sends a request once when a
    # reused keep-alive connection is reset before any answer (so not every reset counts).
    answered = faults["fail"] + faults["throttle"] + faults["truncate"] + faults["corrupt"]
    assert answered <= report["retries"] <= answered + faults["reset"]
    good = {r.target for r in rows if r.status == 200 and r.fault == "none"}
    assert len(good) == files


# -- 8. URL lists, sinks, fan-out, verification ------------------------------------------------
def test_from_file_with_one_bad_line(reference_server: Start, tmp_path: Path) -> None:
    server = reference_server("--files", "100")
    expected = expected_files(100)
    chosen = sorted(expected)[::7]
    urls = tmp_path / "urls.txt"
    lines = [f"{server.url}/get/{name}" for name in chosen]
    lines.insert(3, "ftp://x")
    urls.write_text("\n".join(lines) + "\n")
    dest = tmp_path / "dest"
    report_path = tmp_path / "r.json"
    proc = cli("get", "--from-file", str(urls), str(dest), "--workers", "2", "--quiet",
                     "--report", str(report_path))
    assert proc.returncode == 1, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["files_ok"] == len(chosen) and report["files_failed"] == 1
    (failure,) = report["failures"]
    assert failure["name"] == "ftp://x" and "http" in failure["reason"]
    # names come from the URL path: DEST/get/<name>
    assert_complete(dest, {f"get/{name}": expected[name] for name in chosen})


def tar_bodies(dest: Path) -> dict[str, bytes]:
    """Every member of DEST's shards, read with tarfile; a name twice fails."""
    found: dict[str, bytes] = {}
    for shard in sorted(dest.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                assert member.name not in found, member.name
                found[member.name] = tar.extractfile(member).read()  # type: ignore[union-attr]
    return found


@pytest.mark.parametrize("sink", ["dir", "tar"])
def test_from_file_two_urls_naming_one_file_is_a_failure_naming_both(
        reference_server: Start, tmp_path: Path, sink: str) -> None:
    server = reference_server("--files", "100")
    expected = expected_files(100)
    a, b, c = sorted(expected)[:3]
    other = f"http://localhost:{server.port}"  # another host, the same path: the same name
    lines = [f"{server.url}/get/{a}", f"{server.url}/get/{b}", f"{other}/get/{b}",
             f"{server.url}/get/{c}", f"{other}/get/{a}", f"{server.url}/get/{a}"]
    urls = tmp_path / "urls.txt"
    urls.write_text("\n".join(lines) + "\n")
    dest, report_path = tmp_path / "dest", tmp_path / "r.json"
    for _ in range(2):  # the rerun decides the same
        proc = cli("get", "--from-file", str(urls), str(dest), "--sink", sink, "--quiet",
                   "--report", str(report_path))
        assert proc.returncode == 1, proc.stderr
        report = json.loads(report_path.read_text())
        assert report["files_ok"] == 3 and report["files_failed"] == 2, report
        reasons = {f["name"]: f["reason"] for f in report["failures"]}
        assert sorted(reasons) == [f"{other}/get/{a}", f"{other}/get/{b}"]
        for name, first in ((a, lines[0]), (b, lines[1])):
            reason = reasons[f"{other}/get/{name}"]
            assert "name collision" in reason and first in reason and f"get/{name}" in reason
    stored = stored_files(dest) if sink == "dir" else {
        n: hashlib.md5(body).hexdigest() for n, body in tar_bodies(dest).items()}
    assert stored == {f"get/{n}": expected[n] for n in (a, b, c)}


def test_null_sink_writes_nothing(reference_server: Start, tmp_path: Path) -> None:
    files = 2000
    server = reference_server("--files", str(files))
    dest = tmp_path / "dest"
    proc, report = get(server.url, dest, tmp_path / "r.json", "--quiet", "--sink", "null")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == files and report["files_failed"] == 0
    assert report["bytes"] == 100 * files
    assert stored_files(dest) == {}
    assert sorted(os.listdir(dest)) == [STATE]
    assert_state_clean(dest)


def test_fanout_two_levels(reference_server: Start, tmp_path: Path) -> None:
    files = 1000
    server = reference_server("--files", str(files))
    dest = tmp_path / "dest"
    proc, report = get(server.url, dest, tmp_path / "r.json", "--quiet", "--fanout", "2")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == files
    expected = {}
    for name, digest in expected_files(files).items():
        h = hashlib.md5(name.encode()).hexdigest()
        expected[f"{h[0:2]}/{h[2:4]}/{name}"] = digest
    assert_complete(dest, expected)
    hex2 = set("0123456789abcdef")
    for path in stored_files(dest):
        first, second, _ = path.split("/")
        assert len(first) == len(second) == 2 and set(first + second) <= hex2, path


def test_no_verify_stores_corrupt_bodies_that_verification_refuses(
        reference_server: Start, tmp_path: Path) -> None:
    files = 200
    server = reference_server("--files", str(files), "--corrupt-rate", "1")
    expected = expected_files(files)

    dest = tmp_path / "unverified"
    proc, report = get(server.url, dest, tmp_path / "r1.json", "--quiet", "--no-verify",
                       "--retries", "1")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == files and report["retries"] == 0
    stored = stored_files(dest)
    assert set(stored) == set(expected)
    assert all(stored[name] != digest for name, digest in expected.items())  # as sent: wrong
    assert all(os.path.getsize(dest / name) == 100 for name in expected)

    dest = tmp_path / "verified"
    proc, report = get(server.url, dest, tmp_path / "r2.json", "--quiet", "--retries", "1")
    assert proc.returncode == 1, proc.stderr
    assert report["files_ok"] == 0 and report["files_failed"] == files
    assert report["retries"] == files
    assert all("MD5" in f["reason"] and f["attempts"] == 2 for f in report["failures"])
    assert stored_files(dest) == {}
    assert_state_clean(dest)


# -- 9. usage errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["missing-dest", "bad-scheme", "dest-is-file", "workers-0",
                                  "template", "no-url-file", "report-dir-missing",
                                  "dest-under-a-file", "from-stdin", "from-fifo"])
def test_usage_errors(reference_server: Start, tmp_path: Path, case: str) -> None:
    server = reference_server("--files", "10", access_log=True)
    dest = tmp_path / "dest"
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    fifo = tmp_path / "urls.fifo"
    os.mkfifo(fifo)  # read once for collisions, then again by byte offset: never a pipe
    args, named = {
        "missing-dest": ([server.url], "DEST"),
        "bad-scheme": (["ftp://x", str(dest)], "ftp://x"),
        "dest-is-file": ([server.url, str(afile)], str(afile)),
        # not "Rerun the same command": a rerun cannot help (read-only storage alike)
        "dest-under-a-file": ([server.url, str(afile / "sub")], "cannot write to DEST"),
        "workers-0": ([server.url, str(dest), "--workers", "0"], "--workers"),
        "template": ([server.url, str(dest), "--get-template", "/files/"], "{name}"),
        "no-url-file": (["--from-file", str(tmp_path / "nope.txt"), str(dest)], "nope.txt"),
        # said before the download, not in a traceback after it
        "report-dir-missing": ([server.url, str(dest), "--report",
                                str(tmp_path / "no-dir" / "r.json")], "no-dir"),
        "from-stdin": (["--from-file", "-", str(dest)], "save the list first"),
        "from-fifo": (["--from-file", str(fifo), str(dest)], "is not a regular file"),
    }[case]
    proc = cli("get", *args, "--quiet")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Error:" in proc.stderr and named in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not dest.exists()
    assert afile.read_text() == "not a directory\n"
    assert server.requests() == []


def test_a_report_into_a_fifo_a_symlink_or_a_full_device_keeps_the_node(
        reference_server: Start, tmp_path: Path) -> None:
    """--report /dev/stdout and the like are written into as a shell's `>` would: the report
    was renamed over the node, and as root /dev/stdout itself became a regular file. (Nodes
    made here in tmp_path: the test must not touch /dev on the code it guards against.)"""
    server = reference_server("--files", "10")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    proc = cli("get", server.url, str(tmp_path / "d1"), "--quiet", "--report", str(fifo))
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and json.loads(got[0])["files_ok"] == 10
    (tmp_path / "link.json").symlink_to("real.json")
    proc = cli("get", server.url, str(tmp_path / "d2"), "--quiet", "--report",
               str(tmp_path / "link.json"))
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(tmp_path / "link.json") == "real.json"  # the link kept
    assert json.loads((tmp_path / "real.json").read_text())["files_ok"] == 10
    full = tmp_path / "full"
    try:
        os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # as /dev/full: ENOSPC
    except PermissionError:
        return  # not root: the two nodes above made the point
    proc = cli("get", server.url, str(tmp_path / "d3"), "--quiet", "--report", str(full))
    assert proc.returncode == 1, proc.stderr
    assert f"cannot write the report {full}: No space left on device" in proc.stderr
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_a_wrong_url_leaves_dest_as_it_found_it(reference_server: Start,
                                                 tmp_path: Path) -> None:
    """Exit 2 on the first list page: no journal of a download that never began, and no DEST
    the run made; a DEST that held something keeps it, an earlier run's journal too."""
    server = reference_server("--files", "10")
    wrong = f"{server.url}/no/such/list/"
    fresh = tmp_path / "fresh"
    proc = cli("get", wrong, str(fresh), "--quiet")
    assert proc.returncode == 2 and "Check the URL" in proc.stderr, proc.stderr
    assert not fresh.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("mine\n")
    proc = cli("get", wrong, str(kept), "--quiet", "--sink", "tar")
    assert proc.returncode == 2, proc.stderr
    assert os.listdir(kept) == ["mine.txt"]  # no journal, no tar index
    assert (kept / "mine.txt").read_text() == "mine\n"
    done = tmp_path / "done"
    assert cli("get", server.url, str(done), "--quiet").returncode == 0
    journal = (done / STATE / "journal.sqlite").read_bytes()
    proc = cli("get", wrong, str(done), "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert (done / STATE / "journal.sqlite").read_bytes() == journal
    assert len(stored_files(done)) == 10


# -- 10. the library API -----------------------------------------------------------------------
def test_library_download_reports_progress(reference_server: Start, tmp_path: Path) -> None:
    files = 3000
    server = reference_server("--files", str(files), "--page-size", "250")
    seen: list[Progress] = []
    report = bulkfetch.api.download(server.url, tmp_path / "dest", workers=1,
                                    progress=seen.append)
    assert report.files_ok == files and report.files_failed == 0 and report.exit_code == 0
    assert report.listing_complete and report.pages == files // 250
    assert seen and all(isinstance(p, Progress) for p in seen)
    oks = [p.files_ok for p in seen]
    assert oks == sorted(oks), "files_ok went backwards"
    assert oks[-1] == files and seen[-1].listing_done
    assert_complete(tmp_path / "dest", expected_files(files))


# -- 11. the demo ------------------------------------------------------------------------------
def test_demo(tmp_path: Path) -> None:
    dest = tmp_path / "demo"
    proc = cli("demo", "--files", "3000", str(dest))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verified 3,000 of 3,000" in proc.stdout + proc.stderr
    assert_complete(dest, expected_files(3000))
    again = cli("demo", "--files", "300", str(dest))  # its own DEST: replaced
    assert again.returncode == 0, again.stderr[-3000:]
    assert_complete(dest, expected_files(300))


def test_demo_leaves_a_real_download_alone(reference_server: Start, tmp_path: Path) -> None:
    dest = tmp_path / "mine"
    server = reference_server("--files", "200")
    proc, _ = get(server.url, dest, tmp_path / "r.json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    (dest / "my-notes.txt").write_text("mine")
    before = sorted(path.relative_to(dest) for path in dest.rglob("*"))
    demo = cli("demo", "--files", "300", str(dest))
    assert demo.returncode == 2, demo.stderr[-3000:]
    assert "was not made by the demo" in demo.stderr and str(dest) in demo.stderr
    assert sorted(path.relative_to(dest) for path in dest.rglob("*")) == before
    assert (dest / "my-notes.txt").read_text() == "mine"


def test_demo_into_a_dest_it_cannot_make_is_a_usage_error(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    demo = cli("demo", "--files", "300", str(afile / "demo"))  # (a traceback before)
    assert demo.returncode == 2 and "Traceback" not in demo.stderr, demo.stderr[-3000:]
    assert f"cannot make DEST '{afile / 'demo'}'" in demo.stderr
    assert afile.read_text() == "x"


# -- proxies from the environment ----------------------------------------------------------
def test_a_proxy_in_the_environment_is_used_and_no_proxy_bypasses_it(
        reference_server: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """libcurl's proxy variables keep working although, without them, bulkfetch tells libcurl
    not to look them up for every transfer."""
    files = 300
    server = reference_server("--files", str(files), access_log=True)
    with socket.socket() as probe:  # a port nothing listens on: the proxy is unreachable
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{dead}")
    proc, report = get(server.url, tmp_path / "via-proxy", tmp_path / "r1.json", "--quiet",
                       "--retries", "0")
    # the first request reaches nothing: the user's to fix (the proxy), said at once
    assert proc.returncode == 2
    assert f"127.0.0.1:{dead} over proxy" in report["error"], report["error"]
    assert "or the proxy the environment names" in report["error"], report["error"]
    assert f"127.0.0.1:{dead} over proxy" in proc.stderr  # --quiet still says why
    assert server.requests() == [], "a request went around the proxy"

    monkeypatch.setenv("no_proxy", "127.0.0.1")
    dest = tmp_path / "bypassed"
    proc, report = get(server.url, dest, tmp_path / "r2.json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == files
    assert_complete(dest, expected_files(files))
