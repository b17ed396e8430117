"""RELIABILITY.md's promises about a run, end to end: the real CLI in a subprocess against the
reference server over loopback.

- Ctrl-C twice (to the whole foreground process group, as a terminal sends it) and SIGTERM
- disk full on a real (tmpfs) file system, the journal on the same full disk
- two runs on one DEST at once
- an older good copy is never destroyed by a failed re-fetch
- modes, owners and mtimes are bulkfetch's own, never the server's
- credentials and signed query strings never reach output, the report or the journal

Every test checks what DEST holds (file contents, tar members, the journal read-only), never
only what the client says about itself.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from getkit import (
    STATE,
    assert_complete,
    assert_state_clean,
    cli,
    command,
    dataset,
    expected_files,
    get,
    index_rows,
    read_journal,
    status,
    status_counts,
    stored_files,
)

from bulkfetch.testing import ReferenceServer

Start = Callable[..., ReferenceServer]
SINKS = ("dir", "tar")
PROMPT_S = 5.0  # "exits at once": generous, on a shared 2-core machine


# -- helpers ---------------------------------------------------------------------------------
def pages_listed(dest: Path) -> int:
    try:
        return len(read_journal(dest, "SELECT seq FROM pages"))
    except sqlite3.OperationalError:  # being created: poll again
        return 0


def parts_left(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.glob("shard-*.tar.part"))


def tar_members(dest: Path) -> dict[str, str]:
    """name -> MD5 of every member the index points to, read from the shard at the indexed
    offset (and checked to be that tar member)."""
    rows = index_rows(dest, "SELECT m.name, s.file, m.offset, m.size, m.md5 "
                           "FROM members m JOIN shards s ON s.id = m.shard")
    found: dict[str, str] = {}
    for name, file, offset, size, md5 in rows:
        with open(dest / file, "rb") as shard:
            shard.seek(offset)
            data = shard.read(size)
        assert len(data) == size and hashlib.md5(data).hexdigest() == md5, (name, file)
        found[name] = md5
    return found


def assert_tar_complete(dest: Path, expected: dict[str, str]) -> None:
    """The index holds each expected name once with its MD5; every shard on disk is in the
    index and is a valid tar whose members are exactly the indexed ones; no .part, no tmp."""
    assert tar_members(dest) == expected
    files = {file for (file,) in index_rows(dest, "SELECT file FROM shards")}
    assert {p.name for p in dest.glob("shard-*")} == files
    seen = 0
    for file in files:
        with tarfile.open(dest / file) as tar:
            for member in tar:
                seen += 1
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                assert hashlib.md5(data).hexdigest() == expected[member.name]
    assert seen == len(expected), f"{seen} members in the shards for {len(expected)} names"
    assert_state_clean(dest)


def assert_sink_complete(sink: str, dest: Path, expected: dict[str, str]) -> None:
    if sink == "dir":
        assert_complete(dest, expected)
    else:
        assert_tar_complete(dest, expected)


def assert_no_temporaries(dest: Path) -> None:
    assert os.listdir(dest / STATE / "tmp") == [], "temporary files left in DEST/.bulkfetch/tmp"
    assert parts_left(dest) == [], f"unfinished shards left: {parts_left(dest)}"


def assert_journal_consistent(sink: str, dest: Path, expected: dict[str, str],
                              page_size: int) -> int:
    """Every file of every page the journal has done is stored, with the right bytes.
    Returns the journal's count of files ok."""
    done = [seq for (seq,) in read_journal(dest, "SELECT seq FROM pages WHERE status = 'done'")]
    names = sorted(expected)
    stored = stored_files(dest) if sink == "dir" else tar_members(dest)
    missing = [n for seq in done for n in names[seq * page_size:(seq + 1) * page_size]
               if stored.get(n) != expected[n]]
    assert not missing, f"pages marked done without their files: {missing[:5]}"
    wrong = [n for n, digest in stored.items() if expected.get(n) != digest]
    assert not wrong, f"stored with wrong content: {wrong[:5]}"
    (ok,), = read_journal(dest, "SELECT files_ok FROM run")
    return ok


class Run:
    """`bulkfetch get` started in its own session (its own process group, as a terminal's
    foreground job), stderr collected line by line while it runs."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.out = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_out, daemon=True)
        self._out_reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.read()

    @property
    def err(self) -> str:
        return "".join(self.lines)

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, \
                f"the run ended (exit {self.proc.returncode}) before {what}:\n{self.err}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    def wait_for_text(self, text: str, timeout: float = 10) -> float:
        """Wait until stderr holds `text`; returns when that was seen."""
        deadline = time.monotonic() + timeout
        while text not in self.err:
            assert time.monotonic() < deadline, f"no {text!r} on stderr:\n{self.err}"
            time.sleep(0.005)
        return time.monotonic()

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        self._out_reader.join(10)
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def live_in_group(pgid: int) -> list[int]:
    """Processes of process group `pgid` that are still running (zombies do not count: an
    orphan's zombie waits for whoever reaps it, which is not bulkfetch's doing)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            alive.append(int(entry))
    return alive


def wait_group_gone(pgid: int, timeout: float) -> float:
    """Seconds until no process of the group runs; fails after `timeout`."""
    started = time.monotonic()
    while live := live_in_group(pgid):
        assert time.monotonic() - started < timeout, \
            f"processes {live} of the run still alive {timeout} s after the second signal"
        time.sleep(0.02)
    return time.monotonic() - started


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], None]]:
    """A 4 MiB tmpfs at tmp_path/disk; call the fixture's value with a size to resize it.
    Always unmounted afterwards."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs",
                           str(mount_point)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): "
                    f"{done.stderr.strip()}")

    def resize(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", "tmpfs", str(mount_point)],
                       check=True, capture_output=True)

    try:
        yield resize
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def restart_on_same_port(start: Start, old: ReferenceServer, *args: str) -> ReferenceServer:
    """Stop `old` and serve `args` on its port (the same URL: the same run for the journal)."""
    port = str(old.port)
    old.stop()
    deadline = time.monotonic() + 20
    while True:
        try:
            return start(*args, "--port", port)
        except RuntimeError:  # the port is not free yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def file_state(dest: Path) -> dict[str, tuple[str, int, int]]:
    """name -> (MD5, inode, mtime_ns) of every file in DEST outside DEST/.bulkfetch."""
    found = {}
    for name, digest in stored_files(dest).items():
        info = os.stat(dest / name)
        found[name] = (digest, info.st_ino, info.st_mtime_ns)
    return found


# -- 1. Ctrl-C, then Ctrl-C again ---------------------------------------------------------------
@pytest.mark.parametrize("sink", SINKS)
def test_second_ctrl_c_exits_at_once_and_the_rerun_completes(
        reference_server: Start, tmp_path: Path, sink: str) -> None:
    files, page_size = 3000, 500
    # 50 ms per answer, 4 transfers per worker: the run would take ~20 s; a tar worker's
    # graceful stop finishes the pages in hand (several seconds), a window for Ctrl-C #2
    server = reference_server("--files", str(files), "--page-size", str(page_size),
                              "--latency", "50")
    dest = tmp_path / "dest"
    expected = expected_files(files)
    run = Run(command(server.url, dest, "--sink", sink, "--concurrency", "4", "--plain"))
    try:
        run.wait_for(lambda: pages_listed(dest) >= 2, "two pages listed")
        time.sleep(1.0)  # transfers under way, files half-written
        assert run.proc.poll() is None
        os.killpg(run.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        run.wait_for_text("Ctrl-C again")
        stopping = run.proc.poll() is None
        with contextlib.suppress(ProcessLookupError):  # a dir run may be gone already
            os.killpg(run.proc.pid, signal.SIGINT)
        second = time.monotonic()
        code = run.finish(timeout=30)
        exited_after = time.monotonic() - second
        gone_after = wait_group_gone(run.proc.pid, PROMPT_S)
    finally:
        run.kill()
    assert code == 130, run.err
    assert exited_after < PROMPT_S and gone_after < PROMPT_S
    assert "Traceback" not in run.err, run.err
    assert "SIGINT) received: stopping" in run.err
    if sink == "tar":  # a tar stop takes seconds: the second Ctrl-C must have cut it short
        assert stopping and "stopped at once" in run.err, run.err
    if "stopped at once" in run.err:
        assert "Rerun the same command to resume" in run.err.split("stopped at once")[1]

    # what the aborted run left: a readable, consistent journal, no temporary files
    assert_no_temporaries(dest)
    result = status(dest)
    assert result.returncode == 0, result.stderr
    assert "interrupted" in result.stdout and "rerun the same command" in result.stdout
    ok, failed, listed = status_counts(result.stdout)
    assert failed == 0 and ok < files and listed > 0
    assert assert_journal_consistent(sink, dest, expected, page_size) == ok

    rerun, report = get(server.url, dest, tmp_path / "rerun.json", "--sink", sink,
                        "--concurrency", "32", "--quiet")
    assert rerun.returncode == 0, rerun.stderr
    assert report["files_ok"] == files and report["resumed_files"] == ok
    assert_sink_complete(sink, dest, expected)
    if sink == "tar":  # and what reads a tar destination back agrees
        listed_names = cli("ls", str(dest))
        assert listed_names.returncode == 0, listed_names.stderr
        assert sorted(listed_names.stdout.splitlines()) == sorted(expected)


# -- 2. SIGTERM -------------------------------------------------------------------------------
@pytest.mark.parametrize("sink", SINKS)
def test_sigterm_stops_like_the_first_ctrl_c(reference_server: Start, tmp_path: Path,
                                             sink: str) -> None:
    files, page_size = 2000, 100
    server = reference_server("--files", str(files), "--page-size", str(page_size),
                              "--latency", "25")
    dest = tmp_path / "dest"
    expected = expected_files(files)
    report_path = tmp_path / "first.json"
    run = Run(command(server.url, dest, "--sink", sink, "--concurrency", "8", "--plain",
                      "--report", str(report_path)))
    try:
        run.wait_for(lambda: pages_listed(dest) >= 4, "four pages listed")
        time.sleep(1.0)
        assert run.proc.poll() is None
        os.kill(run.proc.pid, signal.SIGTERM)  # to the main process only, as `kill PID` does
        run.wait_for_text("SIGTERM received: stopping")
        code = run.finish(timeout=60)
        wait_group_gone(run.proc.pid, PROMPT_S)  # the workers went with it
    finally:
        run.kill()
    assert code == 130, run.err
    assert "Traceback" not in run.err, run.err
    assert "stopped at once" not in run.err  # one signal: the graceful stop
    assert "Exit status 130: interrupted. Rerun the same command to resume." in run.err
    first = json.loads(report_path.read_text())
    assert first["interrupted"] and first["exit_code"] == 130 and first["error"] is None
    assert first["files_failed"] == 0 and first["files_ok"] < files

    assert_no_temporaries(dest)
    result = status(dest)
    assert result.returncode == 0 and "interrupted" in result.stdout, result.stdout
    assert status_counts(result.stdout)[:2] == (first["files_ok"], 0)
    assert assert_journal_consistent(sink, dest, expected, page_size) == first["files_ok"]
    if sink == "tar":  # the graceful stop closed its shards: nothing indexed but not journaled
        assert len(tar_members(dest)) == first["files_ok"]

    rerun, report = get(server.url, dest, tmp_path / "rerun.json", "--sink", sink,
                        "--concurrency", "32", "--quiet")
    assert rerun.returncode == 0, rerun.stderr
    assert report["files_ok"] == files and report["resumed_files"] == first["files_ok"]
    assert_sink_complete(sink, dest, expected)


# -- 3. disk full -----------------------------------------------------------------------------
@pytest.mark.parametrize("sink", SINKS)
def test_disk_full_stops_cleanly_and_the_rerun_completes_after_freeing_space(
        reference_server: Start, small_disk: Callable[[str], None], tmp_path: Path,
        sink: str) -> None:
    files, page_size = 800, 50
    # 800 files of 8 KiB (6.4 MB) into 4 MiB: the disk fills about half way, and the journal
    # (DEST/.bulkfetch/journal.sqlite) sits on the same full disk
    server = reference_server("--files", str(files), "--page-size", str(page_size),
                              "--file-size", "8k")
    dest = tmp_path / "disk" / "dest"
    ds_expected = _expected_8k(files)
    extra = ("--sink", sink, "--shard-files", "50") if sink == "tar" else ("--sink", sink)
    proc, report = get(server.url, dest, tmp_path / "full.json", *extra, "--plain")
    # a run-level error: exit 1 with the reason (2 is for usage, 130 for interrupts)
    assert proc.returncode == 1, proc.stderr
    full = re.compile(r"No space left on device|database or disk is full")
    assert full.search(proc.stderr), proc.stderr
    assert "the run stopped on an error" in proc.stderr and "Rerun the same command" in \
        proc.stderr
    assert report["error"] and full.search(report["error"]), report
    assert report["exit_code"] == 1 and not report["interrupted"]
    assert 0 < report["files_ok"] < files, report["files_ok"]

    # temporary files removed; the journal readable and true to what DEST holds
    assert_no_temporaries(dest)
    result = status(dest)
    assert result.returncode == 0, result.stderr
    ok, failed, _ = status_counts(result.stdout)
    assert (ok, failed) == (report["files_ok"], 0)
    assert assert_journal_consistent(sink, dest, ds_expected, page_size) == ok
    # a shard sealed and indexed after the journal could take no more is kept: the next
    # start journals its pages from the index (a directory's file is fetched again)
    kept = len(tar_members(dest)) if sink == "tar" else ok
    assert kept >= ok

    small_disk("64m")  # space freed
    rerun, report = get(server.url, dest, tmp_path / "rerun.json", *extra, "--quiet")
    assert rerun.returncode == 0, rerun.stderr
    assert report["files_ok"] == files and report["resumed_files"] == kept
    assert_sink_complete(sink, dest, ds_expected)


def _expected_8k(files: int) -> dict[str, str]:
    from bulkfetch.server.dataset import SyntheticDataSet
    from bulkfetch.util.sizes import parse_size_spec

    ds = SyntheticDataSet(files, 1000, 0, parse_size_spec("8k"), False)
    return {ds.name(i): hashlib.md5(ds.body(i)).hexdigest() for i in range(files)}


# -- 4. two runs on one DEST ---------------------------------------------------------------------
@pytest.mark.parametrize("sink", SINKS)
def test_a_second_run_on_the_same_dest_is_refused_even_with_restart(
        reference_server: Start, tmp_path: Path, sink: str) -> None:
    files = 3000
    server = reference_server("--files", str(files), "--page-size", "100", "--latency", "50")
    dest = tmp_path / "dest"
    report_path = tmp_path / "first.json"
    first = Run(command(server.url, dest, "--sink", sink, "--concurrency", "8", "--quiet",
                        "--report", str(report_path)))
    try:
        first.wait_for(lambda: pages_listed(dest) >= 2, "two pages listed")
        for extra in ((), ("--restart",), ("--retry-failed",)):
            second, second_report = get(server.url, dest, tmp_path / "second.json",
                                        "--sink", sink, "--quiet", *extra)
            assert second.returncode == 2, (extra, second.stderr)
            assert "in use by another bulkfetch run" in second.stderr, second.stderr
            assert f"pid {first.proc.pid}" in second.stderr and str(dest) in second.stderr
            assert second_report == {}
            assert not (tmp_path / "second.json").exists()
        assert first.proc.poll() is None, "the first run ended before the second was tried"
        code = first.finish(timeout=120)
    finally:
        first.kill()
    assert code == 0, first.err
    report = json.loads(report_path.read_text())
    assert report["files_ok"] == files and report["resumed_files"] == 0
    assert_sink_complete(sink, dest, expected_files(files))


# -- 5. a failed re-fetch keeps the older good copy ---------------------------------------------
def get_list(urls: Path, dest: Path, report: Path, *extra: str) -> tuple[
        subprocess.CompletedProcess[str], dict]:
    """`bulkfetch get --from-file URLS DEST` to its end; (the process, the report or {})."""
    report.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", "--from-file", str(urls),
                           str(dest), "--workers", "2", "--report", str(report), *extra],
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(report.read_text()) if report.exists() else {}


@pytest.mark.parametrize("sink", SINKS)
def test_a_failed_refetch_never_destroys_the_older_good_copy(
        reference_server: Start, tmp_path: Path, sink: str) -> None:
    files = 60
    server = reference_server("--files", str(files))
    data = dataset(files)
    # a URL list: the server's faults then hit the files only, never a list page
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{server.url}/get/{data.name(i)}\n" for i in range(files)))
    bodies = {f"get/{data.name(i)}": data.body(i) for i in range(files)}
    expected = {name: hashlib.md5(body).hexdigest() for name, body in bodies.items()}
    dest = tmp_path / "dest"
    proc, report = get_list(urls, dest, tmp_path / "r0.json", "--sink", sink, "--quiet")
    assert proc.returncode == 0 and report["files_ok"] == files, proc.stderr
    assert_sink_complete(sink, dest, expected)
    before = file_state(dest) if sink == "dir" else None

    def assert_old_copies_intact() -> None:
        if sink == "dir":
            assert file_state(dest) == before  # same bytes, same inode, same mtime
            assert_state_clean(dest)
        else:
            assert tar_members(dest) == expected
            assert_no_temporaries(dest)
            names = sorted(bodies)
            shown = subprocess.run([sys.executable, "-m", "bulkfetch", "cat", str(dest),
                                    *names], capture_output=True, timeout=60)
            assert shown.returncode == 0, shown.stderr
            assert shown.stdout == b"".join(bodies[n] for n in names)

    # the server now corrupts every body (--restart: start over), then cuts every body short
    # (--retry-failed); attempts add up over the passes of one journal: 2, then 2 + 2
    for fault, retry, attempts in (("--corrupt-rate", "--restart", 2),
                                   ("--truncate-rate", "--retry-failed", 4)):
        server = restart_on_same_port(reference_server, server, "--files", str(files),
                                      fault, "1")
        proc, report = get_list(urls, dest, tmp_path / "r.json", "--sink", sink, "--quiet",
                                "--retries", "1", retry)
        assert proc.returncode == 1, proc.stderr
        assert report["error"] is None and report["listing_complete"]
        assert report["files_failed"] == files and report["files_ok"] == 0
        failures = {f["name"]: f for f in report["failures"]}
        assert set(failures) == set(expected)
        reasons = {f["reason"] for f in failures.values()}
        if fault == "--corrupt-rate":
            assert reasons == {"MD5 of the body does not match the server's ETag/Content-MD5"}
        else:
            assert all("curl error 18" in r or "Content-Length" in r for r in reasons), reasons
        assert {f["attempts"] for f in failures.values()} == {attempts}
        result = status(dest)
        assert "finished with failures" in result.stdout, result.stdout
        assert status_counts(result.stdout) == (0, files, files)
        assert_old_copies_intact()

    server = restart_on_same_port(reference_server, server, "--files", str(files))
    proc, report = get_list(urls, dest, tmp_path / "r.json", "--sink", sink, "--quiet",
                            "--retry-failed")
    assert proc.returncode == 0 and report["files_ok"] == files, proc.stderr
    # tar: every name stored again, so the earlier shards are gone: each name once
    assert_sink_complete(sink, dest, expected)


# -- 6. modes, owners and mtimes are not the server's -------------------------------------------
OLD = 978_307_200  # 2001-01-01: the served files' mtime, sent as Last-Modified
UMASK = 0o027


def test_modes_owners_and_mtimes_are_not_taken_from_the_server(
        reference_server: Start, tmp_path: Path) -> None:
    root = tmp_path / "served"
    (root / "sub").mkdir(parents=True)
    bodies = {"a.sh": b"#!/bin/sh\necho hi\n", "sub/b.bin": bytes(range(256)) * 3,
              "c.txt": b"plain\n"}
    for name, body in bodies.items():
        path = root / name
        path.write_bytes(body)
        os.chmod(path, 0o6777)  # setuid, setgid, every exec and write bit
        with contextlib.suppress(PermissionError):
            os.chown(path, 4242, 4242)
        os.utime(path, (OLD, OLD))
    server = reference_server("--root", str(root))
    with urllib.request.urlopen(server.url + "/get/a.sh") as answer:  # what the server says
        assert email.utils.parsedate_to_datetime(answer.headers["Last-Modified"]).timestamp() \
            == OLD
    expected = {name: hashlib.md5(body).hexdigest() for name, body in bodies.items()}

    for sink in SINKS:
        dest = tmp_path / f"dest-{sink}"
        started = time.time()
        done = subprocess.run(command(server.url, dest, "--sink", sink, "--quiet"),
                              capture_output=True, text=True, timeout=120,
                              preexec_fn=lambda: os.umask(UMASK))
        finished = time.time()
        assert done.returncode == 0, done.stderr
        if sink == "dir":
            assert_complete(dest, expected)
            written = [dest / name for name in bodies]
        else:
            assert_tar_complete(dest, expected)
            written = list(dest.glob("shard-*.tar"))
            # tar members: bulkfetch's fixed header, nothing from the server: mode 0644
            # (rw-r--r--, never exec/setuid), uid/gid 0 with empty user/group names (a
            # portable "no owner"), mtime = when the shard was opened, during the run
            for shard in written:
                with tarfile.open(shard) as tar:
                    for member in tar:
                        assert member.isreg()
                        assert member.mode == 0o644, oct(member.mode)
                        assert (member.uid, member.gid, member.uname, member.gname) == \
                            (0, 0, "", "")
                        assert int(started) <= member.mtime <= finished + 1, member.mtime
        for path in written:
            info = os.stat(path)
            # 0644 less the umask: no exec, setuid or setgid bit, whatever was served
            assert stat.S_IMODE(info.st_mode) == 0o644 & ~UMASK, (path, oct(info.st_mode))
            assert (info.st_uid, info.st_gid) == (os.getuid(), os.getgid())
            assert started - 1 <= info.st_mtime <= finished + 1, (path, info.st_mtime)
        if sink == "dir":
            assert stat.S_IMODE(os.stat(dest / "sub").st_mode) == 0o755 & ~UMASK


# -- 7. secrets in URLs never become text --------------------------------------------------------
SECRETS = ("s3cr3t", "SECRETSIG", "AKIDSECRET")
SIGNED = "X-Amz-Signature=SECRETSIG&X-Amz-Credential=AKIDSECRET"


def assert_no_secret(where: str, data: bytes | str) -> None:
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    for secret in SECRETS:
        assert secret.encode() not in raw, f"{secret!r} in {where}"


def assert_nothing_leaked(dest: Path, report_path: Path, *outputs: tuple[str, str]) -> None:
    for where, text in outputs:
        assert_no_secret(where, text)
    assert_no_secret("the report", report_path.read_bytes())
    checked = 0
    for path in (dest / STATE).rglob("*"):  # the journal's sqlite bytes, WAL included
        if path.is_file():
            assert_no_secret(str(path), path.read_bytes())
            checked += 1
    assert checked >= 1
    shown = status(dest)
    assert shown.returncode == 0, shown.stderr
    assert_no_secret("bulkfetch status", shown.stdout + shown.stderr)


def test_credentials_and_signed_urls_never_appear_in_output_report_or_journal(
        reference_server: Start, tmp_path: Path) -> None:
    files = 300
    # seed 0: with one retry, the listing gets through and ~10 files fail (5xx, bad MD5)
    server = reference_server("--files", str(files), "--page-size", "50", "--fail-rate",
                              "0.1", "--corrupt-rate", "0.1", "--seed", "0", access_log=True)
    expected = expected_files(files)
    host = server.url.removeprefix("http://")

    # 1. the listing API, with user-info in the URL
    dest = tmp_path / "api"
    report_path = tmp_path / "api.json"
    proc, report = get(f"http://user:s3cr3t@{host}", dest, report_path, "--retries", "1",
                       "--plain")
    assert proc.returncode == 1, proc.stderr
    assert report["failures"], "the faults must produce per-file errors"
    assert "user:***@" in json.dumps(report["options"])  # masked, not dropped
    assert_nothing_leaked(dest, report_path, ("stdout", proc.stdout), ("stderr", proc.stderr))
    assert all(expected[n] == d for n, d in stored_files(dest).items())

    # a listing that fails: the run's error names the list URL
    failing = reference_server("--files", "10", "--fail-rate", "1")
    dest = tmp_path / "api-error"
    report_path = tmp_path / "api-error.json"
    proc, report = get(f"http://user:s3cr3t@{failing.url.removeprefix('http://')}", dest,
                       report_path, "--retries", "0", "--plain")
    assert proc.returncode == 1 and "listing http://127.0.0.1" in proc.stderr, proc.stderr
    assert report["error"] and "HTTP 50" in report["error"]
    assert_nothing_leaked(dest, report_path, ("stdout", proc.stdout), ("stderr", proc.stderr))

    # 2. --from-file: signed URLs, user-info, an unreachable second host, an unusable line
    urls = tmp_path / "urls.txt"
    lines = []
    for i in range(files):
        where = "127.0.0.1:1" if i % 10 == 0 else host  # nothing listens on port 1
        lines.append(f"http://user:s3cr3t@{where}/get/f{i:010d}?{SIGNED}")
    lines.append(f"ftp://user:s3cr3t@{host}/get/f0000000001?{SIGNED}")  # refused: not http
    urls.write_text("\n".join(lines) + "\n")
    dest = tmp_path / "list"
    report_path = tmp_path / "list.json"
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "get", "--from-file", str(urls),
                           str(dest), "--workers", "2", "--retries", "1", "--plain",
                           "--report", str(report_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(report_path.read_text())
    reasons = [f["reason"] for f in report["failures"]]
    assert any("curl error 7" in r for r in reasons), reasons  # the unreachable host
    assert any(r.startswith(("HTTP 5", "MD5")) for r in reasons), reasons  # server faults
    assert any(f["name"].startswith("ftp://user:***@") for f in report["failures"])
    assert_nothing_leaked(dest, report_path, ("stdout", proc.stdout), ("stderr", proc.stderr))
    # the signed URLs did reach the server (it ignores the query string)
    asked = [r.target for r in server.requests() if r.time >= started]
    assert asked and all(t.endswith("?" + SIGNED) for t in asked if t.startswith("/get/"))
    stored = stored_files(dest)
    assert stored and all(expected[n.removeprefix("get/")] == d for n, d in stored.items())
