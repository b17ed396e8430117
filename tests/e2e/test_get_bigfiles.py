"""Big bodies end to end: the real CLI against the reference server and a small server of
our own on loopback. Bodies above --spool-above stream to disk (dir, tar) or to nothing
(null), verified on the way, under server faults, in memory that does not grow with them."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from getkit import assert_complete, assert_state_clean, get

from bulkfetch.bench.harness import run_measured
from bulkfetch.engine import resume
from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.sizes import parse_size_spec

SIZES = "lognormal:40k:1.5:3m"
FILES = 40
FAULTS = ("--fail-rate", "0.05", "--truncate-rate", "0.05", "--corrupt-rate", "0.05",
          "--reset-rate", "0.05")


def expected(files: int, size: str) -> dict[str, str]:
    data = SyntheticDataSet(files, 1000, 0, parse_size_spec(size))
    return {data.name(i): hashlib.md5(data.body(i)).hexdigest() for i in range(files)}


@pytest.fixture(scope="module")
def faulty() -> Iterator[ReferenceServer]:
    with ReferenceServer("--files", str(FILES), "--file-size", SIZES, "--page-size", "10",
                         *FAULTS) as server:
        yield server


def test_mixed_sizes_under_faults_into_a_directory(faulty: ReferenceServer,
                                                   tmp_path: Path) -> None:
    want = expected(FILES, SIZES)
    data = SyntheticDataSet(FILES, 1000, 0, parse_size_spec(SIZES))
    assert sum(data.size(i) > 64 << 10 for i in range(FILES)) >= 10  # both paths are taken
    proc, report = get(faulty.url, tmp_path / "d", tmp_path / "r.json", "--spool-above", "64k",
                       "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == FILES and report["retries"] > 0
    assert_complete(tmp_path / "d", want)


def test_mixed_sizes_under_faults_into_tar_shards(faulty: ReferenceServer,
                                                  tmp_path: Path) -> None:
    want = expected(FILES, SIZES)
    dest = tmp_path / "t"
    proc, _ = get(faulty.url, dest, tmp_path / "r.json", "--spool-above", "64k",
                  "--sink", "tar", "--shard-files", "15", "--quiet")
    assert proc.returncode == 0, proc.stderr
    got: dict[str, str] = {}
    for shard in dest.glob("*.tar"):
        with tarfile.open(shard) as archive:
            for member in archive:
                got[member.name] = hashlib.md5(archive.extractfile(member).read()).hexdigest()
    assert got == want
    assert_state_clean(dest)


def test_every_body_streams_with_spool_above_0_even_into_null(faulty: ReferenceServer,
                                                            tmp_path: Path) -> None:
    proc, report = get(faulty.url, tmp_path / "n", tmp_path / "r.json", "--spool-above", "0",
                       "--sink", "null", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == FILES
    assert report["bytes"] == sum(SyntheticDataSet(FILES, 1000, 0, parse_size_spec(SIZES)).size(i)
                                  for i in range(FILES))


def test_empty_bodies_streamed_are_counted_by_the_md5_they_were_checked_by(
        tmp_path: Path) -> None:
    """An empty body streamed (--spool-above 0) reads its headers only when it is judged;
    how it was checked is taken after that (deb1516 took it before: "3 by size only")."""
    with ReferenceServer("--files", "3", "--file-size", "0") as server:
        proc, report = get(server.url, tmp_path / "d", tmp_path / "r.json", "--spool-above",
                           "0", "-w", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert_complete(tmp_path / "d", expected(3, "0"))
    assert report["checked"] == {"md5": 3, "digest": 0, "size_only": 0}


def test_memory_does_not_grow_with_the_size_of_the_bodies(tmp_path: Path) -> None:
    """Two bodies of 96 MiB with one worker: held in memory they would need 192 MiB or more
    (each collected, then joined); streamed, the client stays near its usual size."""
    with ReferenceServer("--files", "2", "--file-size", "96m") as server:
        run = run_measured([sys.executable, "-m", "bulkfetch", "get", server.url,
                            str(tmp_path / "d"), "-w", "1", "--quiet"], timeout=300)
    assert run.returncode == 0, run.stderr
    assert_complete(tmp_path / "d", expected(2, "96m"))
    assert run.peak_rss < 150 << 20, f"peak RSS {run.peak_rss >> 20} MiB"


BIG = bytes(range(256)) * 8192  # 2 MiB


class _Handler(http.server.BaseHTTPRequestHandler):
    """/good: a body with its Repr-Digest; /lying: a Repr-Digest of other bytes; /missing: a
    big 404 page. None of them sends an ETag, so only the Repr-Digest can vouch. /ranged
    serves ranges with a Last-Modified and states no digest at all."""

    def do_GET(self) -> None:  # the name http.server calls
        if self.path == "/ranged":
            self._ranged()
            return
        status, digest = {"/good": (200, hashlib.sha256(BIG).digest()),
                          "/lying": (200, hashlib.sha256(b"other").digest()),
                          "/missing": (404, b"")}.get(self.path, (404, b""))
        self.send_response(status)
        self.send_header("Content-Length", str(len(BIG)))
        if digest:
            self.send_header("Repr-Digest", f"sha-256=:{base64.b64encode(digest).decode()}:")
        self.end_headers()
        self.wfile.write(BIG)

    def _ranged(self) -> None:
        start, end = 0, len(BIG)
        wanted = self.headers.get("Range", "")
        if wanted.startswith("bytes=") and self.headers.get("If-Range") == LAST_MODIFIED:
            first, _, last = wanted[6:].partition("-")
            start, end = int(first), int(last) + 1
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(BIG)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", LAST_MODIFIED)
        self.end_headers()
        self.wfile.write(BIG[start:end])

    def log_message(self, *args: object) -> None:
        pass


LAST_MODIFIED = "Wed, 01 Jan 2025 00:00:00 GMT"


@pytest.fixture(scope="module")
def digest_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("sink", ["dir", "tar"])
def test_repr_digest_is_checked_and_error_bodies_are_never_stored(
        digest_server: str, tmp_path: Path, sink: str) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{digest_server}/{name}\n" for name in ("good", "lying", "missing")))
    dest = tmp_path / "d"
    proc, report = get_from_file(urls, dest, tmp_path / "r.json", "--sink", sink,
                                 "--retries", "1", "--spool-above", "1k")
    assert proc.returncode == 1, proc.stderr
    reasons = {failure["name"]: failure["reason"] for failure in report["failures"]}
    assert reasons == {
        "lying": "SHA256 of the body does not match the server's Repr-Digest",
        "missing": "HTTP 404",
    }
    assert report["files_ok"] == 1
    if sink == "dir":
        assert (dest / "good").read_bytes() == BIG
        assert not (dest / "lying").exists() and not (dest / "missing").exists()
    else:
        (shard,) = dest.glob("*.tar")
        with tarfile.open(shard) as archive:
            assert [(m.name, archive.extractfile(m).read()) for m in archive] == [("good", BIG)]
    assert_state_clean(dest)


def get_from_file(urls: Path, dest: Path, report: Path,
                  *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", "--from-file", str(urls),
                           str(dest), "--report", str(report), "--quiet", *extra],
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(report.read_text())


RANGED_FILES, RANGED_SIZE = 3, "24m"


@pytest.mark.parametrize("sink", ["dir", "tar"])
def test_big_files_in_ranges_under_faults(tmp_path: Path, sink: str) -> None:
    with ReferenceServer("--files", str(RANGED_FILES), "--file-size", RANGED_SIZE, *FAULTS,
                         processes=2, access_log=True) as server:
        proc, report = get(server.url, tmp_path / "d", tmp_path / "r.json", "--sink", sink,
                           "--split-above", "8m", "--parts", "4", "--quiet")
        ranged = [r for r in server.requests() if r.status == 206]
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == RANGED_FILES and report["ranged_restarts"] == 0
    assert report["ranged_size_only"] == 0  # the reference server's ETag is the MD5
    assert len(ranged) >= 4 * RANGED_FILES
    assert max(r.length for r in ranged) <= (24 << 20) // 4 + 1
    want = expected(RANGED_FILES, RANGED_SIZE)
    if sink == "dir":
        assert_complete(tmp_path / "d", want)
    else:
        with tarfile.open(next((tmp_path / "d").glob("*.tar"))) as archive:
            assert {m.name: hashlib.md5(archive.extractfile(m).read()).hexdigest()
                    for m in archive} == want


@pytest.mark.parametrize("sink", ["dir", "tar"])
@pytest.mark.parametrize("split_above", ["1g", "4m"], ids=["streamed", "ranged"])
def test_no_verify_stores_big_bodies_as_sent(tmp_path: Path, split_above: str,
                                             sink: str) -> None:
    # Every body corrupted: stored as sent and never retried. dir records no MD5 for them,
    # as for small files (README: "a download with --no-verify records none"); tar indexes
    # the MD5 of the bytes it stored, as for small files, so reads and hash --dest agree.
    with ReferenceServer("--files", "2", "--file-size", "6m", "--corrupt-rate", "1") as server:
        proc, report = get(server.url, tmp_path / "d", tmp_path / "r.json", "--no-verify",
                           "--split-above", split_above, "--parts", "3", "--sink", sink,
                           "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == 2 and report["retries"] == 0
    want = expected(2, "6m")
    if sink == "dir":
        stored = {name: (tmp_path / "d" / name).read_bytes() for name in want}
    else:
        with tarfile.open(next((tmp_path / "d").glob("*.tar"))) as archive:
            stored = {m.name: archive.extractfile(m).read() for m in archive}  # type: ignore[union-attr]
    assert set(stored) == set(want)
    for name, body in stored.items():
        assert len(body) == 6 << 20 and hashlib.md5(body).hexdigest() != want[name]
    checked = subprocess.run([sys.executable, "-m", "bulkfetch", "hash", "--dest",
                              str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    if sink == "dir":
        assert checked.returncode == 2 and "--no-verify" in checked.stderr, checked.stderr
    else:
        assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("extra", [("-c", "500"), ("--split-above", "2m", "--parts", "4")],
                         ids=["streamed-c500", "ranged"])
def test_a_small_open_file_limit_holds_sockets_and_files_alike(tmp_path: Path,
                                                                extra: tuple[str, ...]) -> None:
    # ulimit -n 64: each transfer of a big body holds a socket and a file. Before, the
    # sockets took what the files needed ("cannot create a temporary file ... Too many
    # open files", 36 of 200 with -c 500), or a worker died importing a module.
    with ReferenceServer("--files", "200", "--file-size", "3m") as server:
        command = [sys.executable, "-m", "bulkfetch", "get", server.url, str(tmp_path / "d"),
                   "-w", "2", "-q", "--report", str(tmp_path / "r.json"), *extra]
        proc = subprocess.run(["sh", "-c", 'ulimit -n 64 && exec "$@"', "sh", *command],
                              capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["files_ok"] == 200 and report["files_failed"] == 0
    if extra[0] == "-c":
        assert "more than the open-file limit allows" in proc.stderr
    assert_complete(tmp_path / "d", expected(200, "3m"))


@pytest.mark.parametrize("switch", ["--ignore-ranges", "--wrong-content-range"])
def test_a_server_that_ignores_or_mislabels_ranges_ends_correct(tmp_path: Path,
                                                               switch: str) -> None:
    with ReferenceServer("--files", "2", "--file-size", "12m", switch) as server:
        proc, report = get(server.url, tmp_path / "d", tmp_path / "r.json",
                           "--split-above", "4m", "--parts", "3", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert report["ranged_restarts"] == 2  # each file started over as one stream
    assert_complete(tmp_path / "d", expected(2, "12m"))


def test_a_split_file_no_digest_vouches_for_is_said_to_be_checked_by_size(
        digest_server: str, tmp_path: Path) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text(f"{digest_server}/ranged\n")
    proc, report = get_from_file(urls, tmp_path / "d", tmp_path / "r.json",
                                 "--split-above", "1m", "--parts", "4", "--spool-above", "64k")
    assert proc.returncode == 0, proc.stderr
    assert report["ranged_size_only"] == 1 and report["ranged_restarts"] == 0
    assert (tmp_path / "d" / "ranged").read_bytes() == BIG


# -- resuming a big file byte by byte ---------------------------------------------------------
RESUMED = "64m"
RESUMED_TOTAL = 64 << 20
PACED = ("--files", "1", "--file-size", RESUMED, "--bandwidth-per-connection", "8m")


def start_get(url: str, dest: Path, parts: str = "2") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bulkfetch", "get", url, str(dest), "-w", "1",
                             "--quiet", "--split-above", "16m", "--parts", parts],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def stop_at_half(process: subprocess.Popen[str], dest: Path, sig: int) -> int:
    """Send `sig` to the run's process group once a durable record says about half the
    file is on disk; the bytes that record claims."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = resume.records(dest)
        if found and found[0].written >= RESUMED_TOTAL * 0.45:
            os.killpg(process.pid, sig)
            process.communicate(timeout=30)
            return found[0].written
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError("the download never reached half")


def sent_for_the_file(requests: list, since: int) -> tuple[int, list[int]]:
    """Bytes the server was asked for the file after request number `since`, and the
    statuses."""
    asked = [r for r in requests[since:] if r.target.startswith("/get/")]
    return sum(r.length for r in asked), [r.status for r in asked]


# One connection leaves pieces not started beyond the end of the partial file at the kill.
@pytest.mark.parametrize("parts", ["1", "2"])
def test_kill_9_at_half_then_the_rerun_fetches_only_the_missing_bytes(tmp_path: Path,
                                                                      parts: str) -> None:
    dest = tmp_path / "d"
    with ReferenceServer(*PACED, access_log=True) as server:
        kept = stop_at_half(start_get(server.url, dest, parts), dest, signal.SIGKILL)
        assert kept < RESUMED_TOTAL
        status = subprocess.run([sys.executable, "-m", "bulkfetch", "status", str(dest)],
                                capture_output=True, text=True, timeout=60)
        assert "partial files (a rerun fetches only their missing bytes): 1" in status.stdout
        assert "f0000000000: " in status.stdout
        before = len(server.requests())
        proc, report = get(server.url, dest, tmp_path / "r.json", "-w", "1", "--quiet",
                           "--split-above", "16m", "--parts", parts)
        asked, statuses = sent_for_the_file(server.requests(), before)
    assert proc.returncode == 0, proc.stderr
    assert statuses and set(statuses) == {206}, statuses
    assert asked <= RESUMED_TOTAL - kept and asked <= RESUMED_TOTAL * 0.55, (asked, kept)
    assert report["ranged_restarts"] == 0
    # what the partial file held is said, and left out of the rate
    assert report["continued_bytes"] >= kept, (report["continued_bytes"], kept)
    assert report["continued_bytes"] + asked == RESUMED_TOTAL
    assert report["bytes_per_s"] * report["duration_s"] == pytest.approx(asked, rel=0.01)
    assert_complete(dest, expected(1, RESUMED))
    assert os.listdir(dest / ".bulkfetch" / "partial") == []


def test_a_file_changed_between_runs_starts_over_and_ends_as_the_new_file(
        tmp_path: Path) -> None:
    dest = tmp_path / "d"
    with ReferenceServer(*PACED) as server:
        stop_at_half(start_get(server.url, dest), dest, signal.SIGINT)  # Ctrl-C keeps it
        port = server.url.rsplit(":", 1)[1]
    # the same URL (the journal's source), every file rewritten
    with ReferenceServer(*PACED, "--etag-salt", "rewritten", "--port", port) as server:
        proc, report = get(server.url, dest, tmp_path / "r.json", "-w", "1", "--quiet",
                           "--split-above", "16m", "--parts", "2")
    assert proc.returncode == 0, proc.stderr
    assert report["ranged_restarts"] == 1
    assert report["continued_bytes"] == 0  # nothing of the old partial file was kept
    data = SyntheticDataSet(1, 1000, 0, parse_size_spec(RESUMED), salt="rewritten")
    assert_complete(dest, {data.name(0): hashlib.md5(data.body(0)).hexdigest()})
    assert os.listdir(dest / ".bulkfetch" / "partial") == []


def test_a_big_name_listed_twice_never_shares_a_partial_file(tmp_path: Path) -> None:
    """Both transfers of the name are in flight together: the second goes as a plain stream
    into its own temporary file instead of writing into (or emptying) the first's."""
    with ReferenceServer("--files", "2", "--file-size", "24m",
                         "--bandwidth-per-connection", "16m") as server:
        # one name on two pages of 1,000 rows (a page drops an item listed twice; two URLs
        # for one name are refused as a collision, so it is the same URL both times)
        first, other = f"{server.url}/get/f0000000000", f"{server.url}/get/f0000000001"
        rows = [(first, "get/f0000000000"), *[(other, "get/f0000000001")] * 999,
                (first, "get/f0000000000")]
        (tmp_path / "urls.csv").write_text("url,name\n" + "".join(f"{u},{n}\n" for u, n in rows))
        proc = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", "--from-file", str(tmp_path / "urls.csv"),
             "--name-col", "name", str(tmp_path / "d"), "-w", "1", "--quiet", "--split-above",
             "1m", "--parts", "2", "--report", str(tmp_path / "r.json")],
            capture_output=True, text=True, timeout=120)
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == 3 and report["retries"] == 0, report
    data = SyntheticDataSet(2, 1000, 0, parse_size_spec("24m"))
    for index in (0, 1):
        assert (tmp_path / "d" / "get" / data.name(index)).read_bytes() == data.body(index)
    assert os.listdir(tmp_path / "d" / ".bulkfetch" / "partial") == []


def test_pieces_waiting_for_their_retry_leave_the_loop_asleep(tmp_path: Path) -> None:
    """Half the answers are 429 with Retry-After 2: a split file's pieces wait for their
    retry with nothing in flight and no hash job running. The loop sleeps meanwhile; it used
    to spin (17 s of CPU in a 23 s run of a 64 MiB file). Not a speed limit: a loop that
    spins burns about as much CPU as the run takes time, one that sleeps a few percent."""
    with ReferenceServer("--files", "1", "--file-size", "16m", "--throttle-rate", "0.5",
                         "--retry-after", "2") as server:
        run = run_measured([sys.executable, "-m", "bulkfetch", "get", server.url,
                            str(tmp_path / "d"), "-w", "1", "--split-above", "1m",
                            "--parts", "4", "--quiet", "--report", str(tmp_path / "r.json")],
                           timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["retries"] >= 1 and run.seconds >= 2, (report["retries"], run.seconds)
    assert_complete(tmp_path / "d", expected(1, "16m"))
    assert run.cpu_seconds < 0.3 * run.seconds, (run.cpu_seconds, run.seconds)
