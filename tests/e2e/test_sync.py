"""`bulkfetch get --sync` (issue 24) against the reference server at two epochs: after a
complete run, `--epoch 2 --mutate-rate P` plus new files: the sync fetches exactly the
changed and new files (the server's access log), answers the rest with 304s that leave
their files alone (inode and mtime), and DEST then equals a fresh download. Over S3 the
listing's ETags decide, with no request for an unchanged object. `--delete --dry-run` lists
what is gone, `--delete` removes exactly that and nothing outside DEST; an interrupted sync
resumes; bad combinations are usage errors."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from getkit import assert_complete, command, get, read_journal

from bulkfetch.server.dataset import SyntheticDataSet, mutated_indices
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.ports import free_port
from bulkfetch.util.sizes import parse_size_spec

FILES, SEED, RATE, GROWN = 3000, 7, 0.02, 3030
SIZES = "uniform:1:2000"
BASE = ("--files", str(FILES), "--seed", str(SEED), "--file-size", SIZES, "--page-size", "250")
EPOCH_2 = ("--files", str(GROWN), *BASE[2:], "--epoch", "2", "--mutate-rate", str(RATE))


# Every server of this module answers on one port: DEST's journal is bound to the source's
# URL, and a sync is a rerun against the same URL (the servers run one after another).
PORT = ("--port", str(free_port()))


def data_set(files: int, epoch: int = 1) -> SyntheticDataSet:
    return SyntheticDataSet(files, 250, SEED, parse_size_spec(SIZES), epoch=epoch,
                            mutate_rate=RATE if epoch > 1 else 0.0)


def md5s(files: int, epoch: int = 1) -> dict[str, str]:
    found = data_set(files, epoch)
    return {found.name(i): hashlib.md5(found.body(i)).hexdigest() for i in range(files)}


def changed_and_new() -> set[str]:
    found = data_set(GROWN, 2)
    return {found.name(i) for i in mutated_indices(SEED, FILES, RATE, 1, 2)} | \
        {found.name(i) for i in range(FILES, GROWN)}


def file_gets(server: ReferenceServer) -> dict[int, set[str]]:
    """status -> names the server answered a GET /get/NAME with."""
    found: dict[int, set[str]] = {}
    for request in server.requests():
        if request.target.startswith("/get/"):
            found.setdefault(request.status, set()).add(request.target[5:])
    return found


def stats(dest: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.iterdir()
            if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DEST downloaded completely at epoch 1 (copied by each test that changes it)."""
    dest = tmp_path_factory.mktemp("sync") / "epoch1"
    with ReferenceServer(*PORT, *BASE) as server:
        proc, report = get(server.url, dest, dest.parent / "r.json")
    assert proc.returncode == 0 and report["files_ok"] == FILES, proc.stderr
    return dest


def copy_of(filled: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "dest"
    subprocess.run(["cp", "-a", str(filled), str(dest)], check=True)
    return dest


def assert_sums_hold_dest(dest: Path, files: int) -> None:
    """`hash --dest` and `md5sum -c`, which check every line of DEST's sums, find DEST as it
    is now: no line of a file's older version, none of a removed file."""
    checked = subprocess.run([sys.executable, "-m", "bulkfetch", "hash", "--dest", str(dest)],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    assert f"{files:,} files verified" in checked.stderr, checked.stderr
    sums = sorted((dest / ".bulkfetch" / "sums").glob("*.md5"))
    coreutils = subprocess.run(["md5sum", "-c", "--quiet", *map(str, sums)], cwd=dest,
                               capture_output=True, text=True, timeout=120)
    assert coreutils.returncode == 0, coreutils.stdout[-2000:] + coreutils.stderr[-2000:]


def test_sync_fetches_exactly_the_changed_and_new_files(filled: Path, tmp_path: Path) -> None:
    dest = copy_of(filled, tmp_path)
    before = stats(dest)
    fetch = changed_and_new()
    assert 30 < len(fetch) - (GROWN - FILES) < 120  # ~2% of 3,000 changed
    with ReferenceServer(*PORT, *EPOCH_2, access_log=True) as server:
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sync")
        answered = file_gets(server)
    assert proc.returncode == 0, proc.stderr
    assert answered.get(200) == fetch  # exactly the changed and new files, once each
    assert answered.get(304) == set(md5s(FILES)) - fetch
    assert set(answered) == {200, 304}
    assert (report["files_ok"], report["unchanged"]) == (GROWN, GROWN - len(fetch))
    after = stats(dest)
    for name, was in before.items():  # untouched: the same inode and mtime
        if name not in fetch:
            assert after[name] == was, name
    assert all(after[name] != before[name] for name in fetch if name in before)
    assert_complete(dest, md5s(GROWN, 2))  # what a fresh download of epoch 2 holds
    assert_sums_hold_dest(dest, GROWN)
    sums = sorted((dest / ".bulkfetch" / "sums").iterdir())
    # and a second sync finds everything in step: no body at all, the sums left as they are
    with ReferenceServer(*PORT, *EPOCH_2, access_log=True) as server:
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sync")
        assert set(file_gets(server)) == {304}
    assert proc.returncode == 0 and report["unchanged"] == GROWN
    assert sorted((dest / ".bulkfetch" / "sums").iterdir()) == sums


def test_a_file_removed_or_edited_in_dest_is_fetched_again(filled: Path,
                                                            tmp_path: Path) -> None:
    """A file edited in DEST after it was stored has a recorded MD5 that is no longer its
    own: asked for with it, the server answered 304 and the edit stayed."""
    dest = copy_of(filled, tmp_path)
    gone, edited = sorted(md5s(FILES))[5:7]
    (dest / gone).unlink()
    (dest / edited).write_bytes(b"edited by hand")
    with ReferenceServer(*PORT, *BASE, access_log=True) as server:
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sync")
        assert file_gets(server).get(200) == {gone, edited}
    assert proc.returncode == 0, proc.stderr
    assert report["changed_in_dest"] == 1
    assert_complete(dest, md5s(FILES))


def test_delete_dry_run_lists_and_delete_removes_only_what_is_gone(
        filled: Path, tmp_path: Path) -> None:
    dest = copy_of(filled, tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("not DEST's")
    (dest / "planted-link").symlink_to(outside)  # not listed: the link goes, not its target
    shrunk = FILES - 40
    names = sorted(md5s(FILES))
    gone = [*sorted(set(names) - set(md5s(shrunk))), "planted-link"]
    args = ("--files", str(shrunk), *BASE[2:])
    with ReferenceServer(*PORT, *args, access_log=True) as server:
        dry = subprocess.run(command(server.url, dest, "--sync", "--delete", "--dry-run"),
                             capture_output=True, text=True, timeout=120)
        assert file_gets(server) == {}  # a dry run fetches nothing
        assert dry.returncode == 0, dry.stderr
        assert sorted(dry.stdout.split("\n")[:-1]) == sorted(f"would delete {n}" for n in gone)
        assert "41 files" in dry.stderr and "Nothing was fetched or removed" in dry.stderr
        assert len(stats(dest)) == FILES  # nothing removed
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sync", "--delete")
    assert proc.returncode == 0, proc.stderr
    assert report["deleted"] == len(gone)
    assert outside.read_text() == "not DEST's"
    assert_complete(dest, md5s(shrunk))
    assert (dest / ".bulkfetch" / "journal.sqlite").exists()
    assert_sums_hold_dest(dest, shrunk)


def test_max_delete_refuses_a_pass_that_would_remove_more_and_removes_nothing(
        filled: Path, tmp_path: Path) -> None:
    """A source 40 files shorter: --max-delete 1% (30 of 3,000) refuses, exit 2, nothing
    removed, and the dry run says it would refuse; --max-delete 40 removes the 40."""
    dest = copy_of(filled, tmp_path)
    before = stats(dest)
    with ReferenceServer(*PORT, "--files", str(FILES - 40), *BASE[2:]) as server:
        dry = subprocess.run(command(server.url, dest, "--sync", "--delete", "--dry-run",
                                     "--max-delete", "1%"),
                             capture_output=True, text=True, timeout=120)
        assert dry.returncode == 0, dry.stderr
        assert "would refuse to remove the 40 files (more than --max-delete 1%)" in dry.stderr
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sync", "--delete",
                           "--max-delete", "1%")
        assert proc.returncode == 2, proc.stderr
        assert "would remove 40 of the 3,000 files in DEST" in report["error"]
        assert report["deleted"] == 0 and stats(dest) == before
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sync", "--delete",
                           "--max-delete", "40")
    assert proc.returncode == 0, proc.stderr
    assert report["deleted"] == 40
    assert_complete(dest, md5s(FILES - 40))


def kill_once_a_second_page_is_done(server: ReferenceServer, dest: Path, *args: str) -> None:
    """Start `bulkfetch get` into DEST and SIGKILL it once a page after the first is done."""
    run = subprocess.Popen(command(server.url, dest, "-q", *args), start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not read_journal(dest, "SELECT 1 FROM pages WHERE status = 'done' AND seq >= 1"):
            assert run.poll() is None
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def test_delete_waits_for_a_complete_listing(filled: Path, tmp_path: Path) -> None:
    """A sync that stops before the listing ends removes nothing: the files not yet listed
    are not gone. Its rerun resumes and then removes what is gone."""
    dest = copy_of(filled, tmp_path)
    args = ("--files", str(FILES - 10), *BASE[2:], "--list-latency", "400")
    with ReferenceServer(*PORT, *args) as server:
        kill_once_a_second_page_is_done(server, dest, "--sync", "--delete")
        assert len(stats(dest)) == FILES  # killed mid-listing: nothing removed
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sync", "--delete")
    assert proc.returncode == 0, proc.stderr
    assert report["deleted"] == 10
    assert_complete(dest, md5s(FILES - 10))


def get_s3(server: ReferenceServer, dest: Path, *extra: str
           ) -> subprocess.CompletedProcess[str]:
    """`bulkfetch get s3://bulkfetch DEST` from the reference server, unsigned, with no AWS
    setting of this machine's in the way."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    return subprocess.run(
        [sys.executable, "-m", "bulkfetch", "get", "s3://bulkfetch", str(dest),
         "--endpoint-url", server.url, "--no-sign-request", "-w", "2", "-q", *extra],
        capture_output=True, text=True, timeout=300, env=env)


def test_delete_refuses_a_download_a_plain_get_left_unfinished(tmp_path: Path) -> None:
    """A plain `get` killed halfway, then `--sync --delete`: the pages it had done were never
    noted by a sync pass, and --delete removed every file they stored (by hand: 17,000 of
    20,000). It is a usage error now, with nothing removed; finished, DEST syncs as usual."""
    dest = tmp_path / "dest"
    args = ("--files", str(FILES), *BASE[2:], "--list-latency", "400")
    with ReferenceServer(*PORT, *args) as server:
        kill_once_a_second_page_is_done(server, dest)
        stored = set(stats(dest))
        assert stored
        proc, _ = get(server.url, dest, tmp_path / "r.json", "--sync", "--delete")
        assert proc.returncode == 2, proc.stderr
        assert "a plain `bulkfetch get` began and did not finish" in proc.stderr
        assert set(stats(dest)) == stored  # nothing removed
        proc, _ = get(server.url, dest, tmp_path / "r.json", "--sync")  # finishes it
        assert proc.returncode == 0, proc.stderr
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sync", "--delete")
    assert proc.returncode == 0, proc.stderr
    assert report["deleted"] == 0
    assert_complete(dest, md5s(FILES))


def test_delete_refuses_to_empty_dest_on_an_empty_listing(filled: Path,
                                                           tmp_path: Path) -> None:
    """A listing with no file at all (a server's or a path's mistake far more often than a
    source emptied on purpose) would make --delete remove everything: exit 2, nothing."""
    dest = copy_of(filled, tmp_path)
    with ReferenceServer(*PORT, "--files", "0", *BASE[2:]) as server:
        dry = subprocess.run(command(server.url, dest, "--sync", "--delete", "--dry-run"),
                             capture_output=True, text=True, timeout=120)
        assert dry.returncode == 0 and "would refuse to remove the 3,000 files" in dry.stderr
        proc, report = get(server.url, dest, tmp_path / "r.json", "--sync", "--delete")
    assert proc.returncode == 2, proc.stderr
    assert "listed no file at all" in report["error"] and report["deleted"] == 0
    assert_complete(dest, md5s(FILES))


def test_a_source_that_moved_is_synced_with_restart_fetching_nothing_unchanged(
        filled: Path, tmp_path: Path) -> None:
    """The same files behind another URL: the journal is another run's, so a plain --sync is
    refused and points to --restart; --sync --restart asks with DEST's MD5s and fetches no
    body (it once was refused too, leaving only a plain --restart that fetched them all)."""
    dest = copy_of(filled, tmp_path)
    before = stats(dest)
    with ReferenceServer(*BASE, access_log=True) as moved:  # another port
        proc, _ = get(moved.url, dest, tmp_path / "r.json", "--sync")
        assert proc.returncode == 2 and "with --sync, only the files that differ" in proc.stderr
        proc, report = get(moved.url, dest, tmp_path / "r.json", "--sync", "--restart")
        answered = file_gets(moved)
    assert proc.returncode == 0, proc.stderr
    assert set(answered) == {304} and report["unchanged"] == FILES
    assert stats(dest) == before  # not one file touched
    assert_sums_hold_dest(dest, FILES)


def test_over_s3_an_unchanged_object_is_not_asked_for(tmp_path: Path) -> None:
    dest = tmp_path / "dest"

    def sync(server: ReferenceServer, *extra: str) -> subprocess.CompletedProcess[str]:
        return get_s3(server, dest, "--report", str(tmp_path / "r.json"), *extra)

    with ReferenceServer(*PORT, "--s3", *BASE) as server:
        assert sync(server).returncode == 0
    with ReferenceServer(*PORT, "--s3", *EPOCH_2, access_log=True) as server:
        proc = sync(server, "--sync")
        objects = {r.target.split("?")[0].rsplit("/", 1)[1] for r in server.requests()
                   if r.target.startswith("/bulkfetch/") and r.method == "GET"}
        statuses = {r.status for r in server.requests() if r.target.startswith("/bulkfetch/")}
    assert proc.returncode == 0, proc.stderr
    assert objects == changed_and_new() and statuses == {200}  # no 304: not asked at all
    assert_complete(dest, md5s(GROWN, 2))


def test_over_s3_delete_spares_what_the_filters_leave_out(tmp_path: Path) -> None:
    """--include/--exclude narrow what a pass lists: a file they do not take was left out,
    not removed at the source, so --delete leaves it (rsync, rclone and `aws s3 sync` do
    the same); one they take that the source no longer has is removed."""
    dest = tmp_path / "dest"
    names = sorted(md5s(FILES))
    wanted = [name for name in names if name.endswith("7")]  # f...7: one in ten
    with ReferenceServer(*PORT, "--s3", *BASE) as server:
        assert get_s3(server, dest).returncode == 0  # everything, no filter
        assert get_s3(server, dest, "--restart", "--include", "*7").returncode == 0
    shrunk = FILES - 40  # the last 40 names leave the source, 4 of them wanted
    gone = [name for name in wanted if name not in md5s(shrunk)]
    assert len(gone) == 4
    with ReferenceServer(*PORT, "--s3", "--files", str(shrunk), *BASE[2:]) as server:
        dry = get_s3(server, dest, "--sync", "--delete", "--dry-run", "--include", "*7")
        assert dry.returncode == 0, dry.stderr
        assert sorted(dry.stdout.splitlines()) == [f"would delete {n}" for n in gone]
        proc = get_s3(server, dest, "--sync", "--delete", "--include", "*7")
    assert proc.returncode == 0, proc.stderr
    left = set(stats(dest))
    assert left == set(names) - set(gone)  # the 2,700 left out of the filter are all there


@pytest.mark.parametrize(("args", "said"), [
    (("--sync", "--sink", "tar"), "--sync keeps a directory in step"),
    (("--sync", "--sink", "null"), "not --sink null: it stores nothing"),
    (("--delete",), "--delete and --dry-run go with --sync"),
    (("--dry-run",), "--delete and --dry-run go with --sync"),
    (("--sync", "--retry-failed"), "drop --retry-failed"),
])
def test_bad_combinations_are_usage_errors(tmp_path: Path, args: tuple[str, ...],
                                           said: str) -> None:
    proc = subprocess.run(command("http://127.0.0.1:9", tmp_path / "d", *args),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert not (tmp_path / "d").exists()
