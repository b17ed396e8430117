"""What the `bulkfetch get` end-to-end tests share: expected content from the data set's
formula, what DEST holds, and running the real CLI."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.util.sizes import parse_size_spec

STATE = ".bulkfetch"
STATE_ENTRIES = {"journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm", "lock", "tmp",
                 "partial", "sums", "failures.jsonl", "status.json", "metrics.prom",
                 "sync.sqlite",  # (get --sync's index)
                 "demo"}  # (the mark that lets `bulkfetch demo` replace its DEST)


def dataset(files: int, nested: bool = False, seed: int = 0) -> SyntheticDataSet:
    return SyntheticDataSet(files, 1000, seed, parse_size_spec("100"), nested)


def expected_files(files: int, seed: int = 0, nested: bool = False) -> dict[str, str]:
    """name -> MD5 of its body, computed from the data set's formula."""
    ds = dataset(files, nested, seed)
    return {ds.name(i): hashlib.md5(ds.body(i)).hexdigest() for i in range(files)}


def stored_files(dest: Path) -> dict[str, str]:
    """Relative name -> MD5 of every file under DEST outside DEST/.bulkfetch (no symlinks)."""
    found: dict[str, str] = {}
    for root, dirs, names in os.walk(dest):
        rel = Path(root).relative_to(dest)
        if rel == Path("."):
            dirs[:] = [d for d in dirs if d != STATE]
        for name in names:
            path = Path(root) / name
            assert not path.is_symlink(), path
            found[(rel / name).as_posix()] = hashlib.md5(path.read_bytes()).hexdigest()
    return found


def assert_state_clean(dest: Path) -> None:
    state = dest / STATE
    assert set(os.listdir(state)) <= STATE_ENTRIES, os.listdir(state)
    assert os.listdir(state / "tmp") == [], "temporary files left behind"
    if (state / "partial").exists():
        assert os.listdir(state / "partial") == [], "partial files left behind"


def assert_complete(dest: Path, expected: dict[str, str]) -> None:
    stored = stored_files(dest)
    assert set(stored) == set(expected), sorted(set(stored) ^ set(expected))[:10]
    wrong = [name for name, digest in expected.items() if stored[name] != digest]
    assert not wrong, f"{len(wrong)} files with wrong content, e.g. {wrong[:5]}"
    assert_state_clean(dest)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bulkfetch", *args], capture_output=True,
                          text=True, timeout=timeout)


def command(url: str, dest: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bulkfetch", "get", url, str(dest), "--workers", "2", *extra]


def get(url: str, dest: Path, report: Path, *extra: str,
        timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run `bulkfetch get` to its end; (the process, the --report JSON or {})."""
    report.unlink(missing_ok=True)
    proc = subprocess.run(command(url, dest, "--report", str(report), *extra),
                          capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc, data


def status(dest: Path) -> subprocess.CompletedProcess[str]:
    return cli("status", str(dest), timeout=60)


def status_counts(text: str) -> tuple[int, int, int]:
    """(ok, failed, listed) from `bulkfetch status` output."""
    match = re.search(r"files: ([\d,]+) ok, ([\d,]+) failed, ([\d,]+) listed", text)
    assert match, text
    ok, failed, listed = (int(g.replace(",", "")) for g in match.groups())
    return ok, failed, listed


def read_journal(dest: Path, sql: str) -> list[tuple]:
    """Rows of a query on DEST's journal, opened read-only (safe while a run writes it)."""
    path = dest / STATE / "journal.sqlite"
    if not path.exists():
        return []
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError as exc:  # the schema is not there yet
        if "no such table" in str(exc):
            return []
        raise
    finally:
        conn.close()


def kill_after_pages(run: subprocess.Popen, dest: Path, pages: int,
                     timeout: float = 120) -> None:
    """SIGKILL the process group of `run` (started with start_new_session=True) once DEST's
    journal holds `pages` pages done; fails if the run ends or takes too long first."""
    done, deadline = 0, time.monotonic() + timeout
    while done < pages:
        assert run.poll() is None, f"the run ended after {done} of {pages} pages"
        assert time.monotonic() < deadline, f"{done} of {pages} pages in {timeout:g} s"
        with contextlib.suppress(sqlite3.OperationalError):  # not readable yet
            rows = read_journal(dest, "SELECT count(*) FROM pages WHERE status = 'done'")
            done = rows[0][0] if rows else 0
        time.sleep(0.01)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()


def settled_count(server, quiet_s: float = 0.3, timeout: float = 30) -> int:  # type: ignore[no-untyped-def]
    """The number of requests in `server`'s access log once it stops growing: a killed
    client's requests already in the server are logged as their answers end, after it."""
    count, deadline = len(server.requests()), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = len(server.requests())
        if now == count:
            break
        count = now
    return count


def index_rows(dest: Path, sql: str) -> list[tuple]:
    """Rows of a query on a tar DEST's index.sqlite, read-only ([] before it exists)."""
    path = dest / "index.sqlite"
    if not path.exists():
        return []
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        conn.close()


# -- for the server-side fault tests -------------------------------------------------------------
def file_name(index: int) -> str:
    return f"f{index:010d}"


def expected_body(index: int, files: int, seed: int = 0, size: str = "100") -> bytes:
    return SyntheticDataSet(files, 1000, seed, parse_size_spec(size)).body(index)


def md5_etag(body: bytes) -> str:
    return '"' + hashlib.md5(body).hexdigest() + '"'


def start_http_server(directory: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m http.server` serving `directory` on a free port of 127.0.0.1, its request
    lines going to `log`, once it accepts connections: (the process, its port). The caller
    terminates it."""
    import socket

    from bulkfetch.util.ports import free_port

    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-u", "-m", "http.server", str(port), "--bind", "127.0.0.1",
             "--directory", str(directory)],
            stdout=subprocess.DEVNULL, stderr=out, start_new_session=True)
    deadline = time.monotonic() + 15
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"python -m http.server did not start: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process, port
        except OSError:
            time.sleep(0.05)


def tar_members(dest: Path) -> collections.Counter[str]:
    """Every member of every finished shard, read with tarfile, with its MD5 checked
    against the index."""
    md5 = dict(index_rows(dest, "SELECT name, md5 FROM members"))
    seen: collections.Counter[str] = collections.Counter()
    for shard in sorted(dest.glob("shard-*.tar")):
        with tarfile.open(shard) as archive:
            for member in archive:
                body = archive.extractfile(member)
                assert body is not None
                assert hashlib.md5(body.read()).hexdigest() == md5[member.name], member.name
                seen[member.name] += 1
    assert not list(dest.glob("shard-*.tar.part"))
    return seen


def assert_tar_exactly_once(dest: Path, files: int) -> None:
    expected = expected_files(files)
    seen = tar_members(dest)
    assert set(seen) == set(expected), sorted(set(seen) ^ set(expected))[:5]
    assert max(seen.values()) == 1, [name for name, n in seen.items() if n > 1][:5]
    stored = dict(index_rows(dest, "SELECT name, md5 FROM members"))
    assert stored == expected
