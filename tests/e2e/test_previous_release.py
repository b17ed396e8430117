"""A DEST left half-done by the previous release resumes exactly with this one: everything
on disk (the journal and its fingerprint, the sums, a tar destination's index and shards)
is read as that release wrote it.

The previous release is built from this repository's history at PREVIOUS, installed in a
venv of its own (its C packer compiled, as `pip install` builds it), and run as users run
it: `bulkfetch get`, killed with SIGKILL once some pages are done. This tree's `bulkfetch
get`, the same command, then finishes the run: every file byte-exact, the pages the old run
finished not fetched again (the server's access log), and a tar destination's members each
once.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import venv
from pathlib import Path

import pytest
from getkit import (
    assert_complete,
    expected_files,
    index_rows,
    kill_after_pages,
    read_journal,
    settled_count,
)

from bulkfetch.testing import ReferenceServer

# The last commit before the packages by feature (issue 45): the release users have.
PREVIOUS = "82574a2"
REPO = Path(__file__).resolve().parents[2]
FILES, PAGE_SIZE = 6_000, 100


def release_env() -> dict[str, str]:
    """The environment the old release runs in: without this tree on PYTHONPATH."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv holding the previous release (built from git, not this tree)."""
    if shutil.which("git") is None or _git("cat-file", "-e", f"{PREVIOUS}^{{commit}}").returncode:
        pytest.skip(f"the previous release ({PREVIOUS}) is not in this clone's history "
                    "(a shallow clone): fetch it to run this test")
    work = tmp_path_factory.mktemp("previous-release")
    source = work / "source"
    source.mkdir()
    archive = _git("archive", "--format=tar", PREVIOUS)
    assert archive.returncode == 0, archive.stderr
    archive_path = work / "release.tar"
    archive_path.write_bytes(archive.stdout)
    with tarfile.open(archive_path) as tar:
        tar.extractall(source, filter="data")
    # Its dependencies are this interpreter's (no network); the release itself is installed
    # into the venv as an editable install is (a .pth naming its src/, ahead of this tree),
    # its C packer built in place as `pip install` builds it.
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(work / "venv")
    python = work / "venv" / "bin" / "python"
    built = subprocess.run([str(python), "setup.py", "-q", "build_ext", "--inplace"],
                           capture_output=True, text=True, timeout=600, cwd=source,
                           env=release_env())
    assert built.returncode == 0, built.stdout + built.stderr
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=60, check=True,
                          env=release_env()).stdout.strip()
    Path(site, "bulkfetch-previous.pth").write_text(f"{source / 'src'}\n")
    where = subprocess.run([str(python), "-c", "import bulkfetch; print(bulkfetch.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=work,
                           env=release_env())
    assert where.returncode == 0, where.stderr
    assert str(source) in where.stdout, f"the venv runs another bulkfetch: {where.stdout}"
    return python


def run_killed(python: Path, url: str, dest: Path, extra: tuple[str, ...], pages: int) -> None:
    """`bulkfetch get` of the previous release, killed -9 once `pages` pages are done."""
    proc = subprocess.Popen(
        [str(python), "-m", "bulkfetch", "get", url, str(dest), "--workers", "2", "--quiet",
         *extra], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=dest.parent, env=release_env())
    try:
        kill_after_pages(proc, dest, pages)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


def done_pages(dest: Path) -> set[int]:
    return {seq for (seq,) in read_journal(dest, "SELECT seq FROM pages WHERE status = 'done'")}


def refetched(server: ReferenceServer, since: int, done: set[int]) -> list[str]:
    """/get/ requests logged after the first `since` for names of the `done` pages."""
    names = [request.target for request in server.requests()[since:]
             if request.target.startswith("/get/f")]
    return [name for name in names if int(name[len("/get/f"):]) // PAGE_SIZE in done]


@pytest.mark.parametrize("sink", ["dir", "tar"])
def test_a_dest_the_previous_release_left_half_done_resumes_exactly(
        previous_release: Path, sink: str, tmp_path: Path) -> None:
    expected = expected_files(FILES)
    # Paced (16 in flight, 20 ms an answer: about 800 files/s), so the old run is still
    # going when a few pages are done; a tar run's pages are done as its shards close.
    extra = ("--sink", sink, "--concurrency", "8",
             *(("--shard-files", "300") if sink == "tar" else ()))
    with ReferenceServer("--files", str(FILES), "--page-size", str(PAGE_SIZE), "--latency",
                         "20", access_log=True) as server:
        dest = tmp_path / "dest"
        run_killed(previous_release, server.url, dest, extra, pages=8)
        done = done_pages(dest)
        assert 8 <= len(done) < FILES // PAGE_SIZE, len(done)
        before = settled_count(server)
        started = time.monotonic()
        finished = subprocess.run(
            [sys.executable, "-m", "bulkfetch", "get", server.url, str(dest), "--workers", "2",
             "--quiet", *extra], capture_output=True, text=True, timeout=300)
        assert finished.returncode == 0, finished.stdout + finished.stderr
        assert time.monotonic() - started < 300
        again = refetched(server, before, done)
        assert not again, f"files of pages the old release finished fetched again: {again[:5]}"
    (pages, done_now, ok), = read_journal(
        dest, "SELECT count(*), sum(status = 'done'), sum(ok) FROM pages")
    assert (pages, done_now, ok) == (FILES // PAGE_SIZE, FILES // PAGE_SIZE, FILES)
    if sink == "dir":
        assert_complete(dest, expected)
        return
    rows = index_rows(dest, "SELECT m.name, m.md5 FROM members m")
    assert len(rows) == len({name for name, _ in rows}) == FILES  # each member once
    assert dict(rows) == expected
    shards = {file for (file,) in index_rows(dest, "SELECT file FROM shards")}
    assert shards == {p.name for p in dest.iterdir() if p.name.startswith("shard-")}
    members = 0
    for shard in shards:
        with tarfile.open(dest / shard) as tar:
            members += sum(1 for _ in tar)
    assert members == FILES
