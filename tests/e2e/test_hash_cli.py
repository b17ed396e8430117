"""`bulkfetch hash` end to end: the real CLI in a subprocess beside the real md5sum, sha1sum
and sha256sum on the same files (byte-identical output, each tool's check reading the
other's), failures named with exit 1, and `--dest` on real tar and directory downloads
from the reference server, intact and then with bytes damaged."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bulkfetch
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("md5sum") is None, reason="needs coreutils")

# Names md5sum has to escape, and one that is not UTF-8.
TRICKY = ["back\\slash", "new\nline", "cr\rx", " lead space", "*star", "tab\tx",
          os.fsdecode(b"caf\xe9")]


def bulkfetch_hash(*args: str | Path, cwd: Path | None = None,
                   stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run([sys.executable, "-m", "bulkfetch", "hash", *map(str, args)],
                          capture_output=True, cwd=cwd, input=stdin, timeout=120)
    assert b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
    return proc


def tool(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*map(str, args)], capture_output=True, cwd=cwd, timeout=120)


def sorted_walk(top: str) -> list[str]:
    """The order bulkfetch promises, computed independently: names in byte order per
    directory, depth first, regular files only."""
    found = []
    for name in sorted(os.listdir(top), key=os.fsencode):
        path = os.path.join(top, name)
        if os.path.isdir(path) and not os.path.islink(path):
            found += sorted_walk(path)
        elif os.path.isfile(path):
            found.append(path)
    return found


def listed(tree: Path, under: str = "") -> list[str]:
    """sorted_walk() of data/UNDER, as paths relative to data's parent (the tests' cwd)."""
    return [os.path.relpath(p, tree.parent) for p in sorted_walk(str(tree / under))]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/: 200 files of 1-100 KB in nested directories, the tricky names, one 20 MB file."""
    root = tmp_path_factory.mktemp("hash") / "data"
    rng = random.Random(18)
    for i in range(200):
        path = root / f"d{i % 7}" / f"s{i % 3}" / f"file-{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1000, 100_000)))
    for name in TRICKY:
        (root / name).write_bytes(name.encode(errors="surrogateescape") * 3)
    (root / "huge.bin").write_bytes(rng.randbytes(20 << 20))
    return root


@pytest.mark.parametrize("algo", ["md5", "sha1", "sha256"])
def test_output_is_byte_identical_to_coreutils(tree: Path, algo: str) -> None:
    files = listed(tree)
    theirs = tool(f"{algo}sum", "--", *files, cwd=tree.parent)
    assert theirs.returncode == 0
    ours = bulkfetch_hash("--algo", algo, "--", *files, cwd=tree.parent)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout
    assert ours.stdout.count(b"\n") == 208  # each newline in a name is escaped
    walked = bulkfetch_hash("--algo", algo, "-w", "3", "data", cwd=tree.parent)
    assert walked.stdout == theirs.stdout  # the directory walked, in the same order


def test_md5sum_c_accepts_ours_and_our_check_accepts_theirs(tree: Path, tmp_path: Path) -> None:
    ours = bulkfetch_hash("-q", "data", cwd=tree.parent).stdout
    (tmp_path / "ours.md5").write_bytes(ours)
    checked = tool("md5sum", "-c", tmp_path / "ours.md5", cwd=tree.parent)
    assert checked.returncode == 0 and checked.stdout.count(b": OK\n") == 208
    # md5sum in binary mode (the * marker) for theirs; our check's stdout is md5sum -c's
    theirs = tool("md5sum", "-b", *listed(tree), cwd=tree.parent).stdout
    (tmp_path / "theirs.md5").write_bytes(theirs)
    ours_check = bulkfetch_hash("--check", tmp_path / "theirs.md5", cwd=tree.parent)
    assert ours_check.returncode == 0, ours_check.stderr
    assert ours_check.stdout == checked.stdout
    sha = tool("sha256sum", *listed(tree), cwd=tree.parent).stdout
    by_stdin = bulkfetch_hash("--check", "-", "-w", "1", cwd=tree.parent, stdin=sha)
    assert by_stdin.returncode == 0 and by_stdin.stdout == checked.stdout


def test_a_corrupted_and_a_missing_file_are_named_and_exit_1(tree: Path, tmp_path: Path) -> None:
    work = tmp_path / "data"
    shutil.copytree(tree, work)
    sums = tmp_path / "sums"
    sums.write_bytes(bulkfetch_hash("-q", "data", cwd=tmp_path).stdout)
    victim = work / "d3" / "s1" / "file-010.bin"
    body = bytearray(victim.read_bytes())
    body[len(body) // 2] ^= 1
    victim.write_bytes(bytes(body))
    (work / "new\nline").unlink()
    ours = bulkfetch_hash("--check", sums, cwd=tmp_path)
    theirs = tool("md5sum", "-c", sums, cwd=tmp_path)
    assert (ours.returncode, theirs.returncode) == (1, 1)
    assert ours.stdout == theirs.stdout
    assert b"data/d3/s1/file-010.bin: FAILED\n" in ours.stdout
    assert b"\\data/new\\nline: FAILED open or read\n" in ours.stdout
    err = ours.stderr.decode()
    assert "WARNING: 1 computed checksum did NOT match" in err
    assert "WARNING: 1 listed file could not be read" in err
    assert "No such file or directory" in err
    quiet = bulkfetch_hash("--check", sums, "--quiet", cwd=tmp_path)
    assert quiet.returncode == 1 and b": OK" not in quiet.stdout
    assert quiet.stdout.count(b"FAILED") == 2


def test_an_unreadable_path_is_named_and_the_others_are_hashed(tree: Path) -> None:
    proc = bulkfetch_hash("data/huge.bin", "data/no-such-file", "data/d0", cwd=tree.parent)
    assert proc.returncode == 1
    assert "bulkfetch hash: data/no-such-file: No such file or directory" in proc.stderr.decode()
    expected = tool("md5sum", "data/huge.bin", *listed(tree, "d0"), cwd=tree.parent)
    assert proc.stdout == expected.stdout
    assert "1 failed" in proc.stderr.decode()  # the summary


def test_blake3_matches_the_blake3_package(tree: Path) -> None:
    blake3 = pytest.importorskip("blake3").blake3
    proc = bulkfetch_hash("--algo", "blake3", "data/huge.bin", "data/d1/s0", cwd=tree.parent)
    assert proc.returncode == 0
    expected = b"".join(
        b"%s  %s\n" % (blake3((tree.parent / p).read_bytes()).hexdigest().encode(), p.encode())
        for p in ["data/huge.bin", *listed(tree, "d1/s0")])
    assert proc.stdout == expected
    sums = proc.stdout
    checked = bulkfetch_hash("--check", "-", "--algo", "blake3", cwd=tree.parent, stdin=sums)
    assert checked.returncode == 0 and checked.stdout.count(b": OK\n") == sums.count(b"\n")
    as_sha256 = bulkfetch_hash("--check", "-", cwd=tree.parent, stdin=sums)
    assert as_sha256.returncode == 1  # 64 digits without --algo are read as SHA-256


def test_blake3_without_its_package_says_how_to_install_it(tree: Path) -> None:
    code = ("import sys; sys.modules['blake3'] = None; from bulkfetch.cli import main; "
            "sys.argv = ['bulkfetch', 'hash', '--algo', 'blake3', 'data/huge.bin']; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tree.parent, timeout=60)
    assert proc.returncode == 2
    assert "pip install 'bulkfetch[hash]'" in proc.stderr


@pytest.mark.parametrize("args", [(), ("data", "--check", "sums"), ("--dest", "x", "data")])
def test_usage_errors_exit_2(tree: Path, args: tuple[str, ...]) -> None:
    proc = bulkfetch_hash(*args, cwd=tree.parent)
    assert proc.returncode == 2 and b"Usage:" in proc.stderr


def test_more_workers_than_the_open_file_limit_allows_run_with_those_it_does(
        tmp_path: Path) -> None:
    # 30 batches of 256 files, --workers 100, 40 descriptors: each worker costs two pipes,
    # so the pool stops growing where the limit is and the run goes on with what it has
    tree = tmp_path / "t"
    tree.mkdir()
    for i in range(30 * 256):
        (tree / f"f{i:05d}").write_bytes(b"%d" % i)
    limited = subprocess.run(["sh", "-c", f'ulimit -n 40 && exec "{sys.executable}" -m '
                              f'bulkfetch hash -q --workers 100 "{tree}"'],
                             capture_output=True, timeout=120)
    assert b"Traceback" not in limited.stderr, limited.stderr.decode(errors="replace")
    assert limited.returncode == 0, limited.stderr
    assert limited.stdout == bulkfetch_hash("-q", "--workers", "1", tree).stdout


@pytest.mark.parametrize("algo", ["md5", "sha256"])
def test_a_dash_is_standard_input_as_for_coreutils(tmp_path: Path, algo: str) -> None:
    (tmp_path / "f").write_bytes(b"a file beside stdin")
    body = random.Random(5).randbytes(3 << 20)
    ours = bulkfetch_hash("--algo", algo, "-", "f", "-", cwd=tmp_path, stdin=body)
    theirs = subprocess.run([f"{algo}sum", "-", "f", "-"], input=body, capture_output=True,
                            cwd=tmp_path, timeout=60)
    assert ours.returncode == 0 and ours.stdout == theirs.stdout  # the second "-" is empty


@pytest.mark.parametrize("command", ["hash data", "ls data", "cat data x"])
def test_a_closed_stdout_is_a_usage_error_not_a_traceback(tree: Path, command: str) -> None:
    proc = subprocess.run(  # `bulkfetch hash data >&-`; ls and cat meet it first too
        ["sh", "-c", f'exec "{sys.executable}" -m bulkfetch {command} >&-'],
        capture_output=True, cwd=tree.parent, timeout=120)
    assert b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
    assert proc.returncode == 2 and b"stdout is closed" in proc.stderr


def test_a_check_file_without_checksum_lines_exits_1(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"nothing here\n")
    proc = bulkfetch_hash("--check", "junk", cwd=tmp_path)
    assert proc.returncode == 1
    assert b"junk: no properly formatted checksum lines found" in proc.stderr


# -- --dest -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def downloaded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("dest") / "shards"
    with ReferenceServer("--files", "300", "--file-size", "uniform:100:200k") as server:
        report = bulkfetch.download(server.url, dest, sink="tar", workers=2)
    assert report.exit_code == 0
    return dest


def test_dest_reverifies_a_tar_download(downloaded: Path, tmp_path: Path) -> None:
    proc = bulkfetch_hash("--dest", downloaded)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b""
    assert b"300 members verified" in proc.stderr
    # one byte flipped inside one member: that member, and only it, is named
    dest = tmp_path / "copy"
    shutil.copytree(downloaded, dest)
    with sqlite3.connect(dest / "index.sqlite") as conn:
        name, file, offset, size, md5 = conn.execute(
            "SELECT m.name, s.file, m.offset, m.size, m.md5 FROM members m JOIN shards s "
            "ON s.id = m.shard WHERE m.size > 1000 ORDER BY m.rowid LIMIT 1 OFFSET 57").fetchone()
    with open(dest / file, "r+b") as shard:
        shard.seek(offset + size // 2)
        byte = shard.read(1)
        shard.seek(offset + size // 2)
        shard.write(bytes([byte[0] ^ 0x40]))
        shard.seek(offset)
        assert hashlib.md5(shard.read(size)).hexdigest() != md5
    damaged = bulkfetch_hash("--dest", dest, "-w", "1")
    assert damaged.returncode == 1
    assert damaged.stdout == f"{name}: FAILED\n".encode()
    assert b"WARNING: 1 computed checksum did NOT match" in damaged.stderr


def test_dest_on_a_missing_shard_names_its_members(downloaded: Path, tmp_path: Path) -> None:
    dest = tmp_path / "copy"
    shutil.copytree(downloaded, dest)
    with sqlite3.connect(dest / "index.sqlite") as conn:
        file, files = conn.execute("SELECT file, files FROM shards LIMIT 1").fetchone()
    (dest / file).unlink()
    proc = bulkfetch_hash("--dest", dest, "--quiet")
    assert proc.returncode == 1
    assert proc.stdout.count(b": FAILED open or read\n") == files
    assert proc.stderr.decode().count(file) == 1  # the reason once, not once per member


def test_dest_skips_members_an_older_index_recorded_without_md5(downloaded: Path,
                                                                tmp_path: Path) -> None:
    dest = tmp_path / "copy"
    shutil.copytree(downloaded, dest)
    with sqlite3.connect(dest / "index.sqlite") as conn:  # as indexes before c7235db were
        conn.execute("UPDATE members SET md5 = '' WHERE rowid % 10 = 0")
        blank = conn.execute("SELECT count(*) FROM members WHERE md5 = ''").fetchone()[0]
    assert blank > 0
    proc = bulkfetch_hash("--dest", dest)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b""  # nothing named FAILED
    assert f"{300 - blank} members verified".encode() in proc.stderr
    assert f"WARNING: {blank} members had no MD5 recorded".encode() in proc.stderr


def test_dest_reverifies_a_directory_download_and_md5sum_reads_its_sums(
        tmp_path: Path) -> None:
    dest = tmp_path / "plain"
    # sizes on both sides of --spool-above (1 MiB): bodies from memory and from spools
    with ReferenceServer("--files", "300", "--file-size", "uniform:100:3m") as server:
        assert bulkfetch.download(server.url, dest, workers=2, fanout=1).exit_code == 0
    proc = bulkfetch_hash("--dest", dest)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"" and b"300 files verified" in proc.stderr
    sums = b"".join(p.read_bytes() for p in sorted((dest / ".bulkfetch/sums").iterdir()))
    assert sums.count(b"\n") == 300
    checked = subprocess.run(["md5sum", "-c", "--quiet", "-"], input=sums, cwd=dest,
                             capture_output=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # one byte flipped in one file, another file gone: those two, and only they, are named
    files = sorted(p for p in dest.rglob("f*") if p.is_file() and ".bulkfetch" not in p.parts)
    flipped, gone = files[57], files[58]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x40
    flipped.write_bytes(data)
    gone.unlink()
    damaged = bulkfetch_hash("--dest", dest, "-w", "1")
    assert damaged.returncode == 1
    assert sorted(damaged.stdout.decode().splitlines()) == sorted([  # in the sums' order
        f"{flipped.relative_to(dest)}: FAILED", f"{gone.relative_to(dest)}: FAILED open or read"])
    assert b"WARNING: 1 computed checksum did NOT match" in damaged.stderr


def test_dest_on_a_directory_without_recorded_sums_exits_2_and_says_what_to_do(
        tmp_path: Path) -> None:
    dest = tmp_path / "plain"
    with ReferenceServer("--files", "20") as server:
        assert bulkfetch.download(server.url, dest, workers=1, verify=False).exit_code == 0
    proc = bulkfetch_hash("--dest", dest)
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert "has no checksums recorded" in err and f"bulkfetch hash {dest} > sums" in err


def test_dest_holds_a_directory_to_the_latest_line_of_each_file(tmp_path: Path) -> None:
    """A file fetched again (a resumed page, --restart, --sync) has a newer sums line in a
    newer file: that line is the one checked, whatever the older ones say."""
    dest = tmp_path / "dest"
    sums = dest / ".bulkfetch" / "sums"
    sums.mkdir(parents=True)
    (dest / "a").write_bytes(b"now")
    (dest / "b").write_bytes(b"b")
    now, before = hashlib.md5(b"now").hexdigest(), hashlib.md5(b"before").hexdigest()
    b_md5 = hashlib.md5(b"b").hexdigest()

    def log(name: str, lines: str, age: float) -> None:
        (sums / name).write_text(lines)
        os.utime(sums / name, (time.time() - age, time.time() - age))

    log("w1-100.md5", f"{before}  a\n{b_md5}  b\n", 60)
    log("w0-200.md5", f"{now}  a\n", 30)
    proc = bulkfetch_hash("--dest", dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert b"2 files verified" in proc.stderr
    os.utime(sums / "w1-100.md5")  # now the old line is the newer one: it holds, and fails
    proc = bulkfetch_hash("--dest", dest)
    assert proc.returncode == 1 and proc.stdout == b"a: FAILED\n"


@pytest.mark.parametrize("verify", [True, False])
def test_dest_after_a_restart_against_changed_files_holds_and_md5sum_agrees(
        tmp_path: Path, verify: bool) -> None:
    """Also under --no-verify: into a DEST with recorded MD5s, a file stored again gets its
    line (without one, its older line would be the latest, and untrue)."""
    dest = tmp_path / "dest"
    shape = ("--files", "120", "--file-size", "uniform:100:3m", "--port", str(free_port()))
    with ReferenceServer(*shape) as server:
        assert bulkfetch.download(server.url, dest, workers=2).exit_code == 0
    with ReferenceServer(*shape, "--epoch", "2", "--mutate-rate", "0.2") as server:
        assert bulkfetch.download(server.url, dest, workers=2, restart=True,
                                  verify=verify).exit_code == 0
    proc = bulkfetch_hash("--dest", dest)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert b"120 files verified" in proc.stderr
    files = sorted((dest / ".bulkfetch" / "sums").glob("*.md5"))
    assert len(files) == 1  # one line per file: md5sum -c reads them as they are
    coreutils = subprocess.run(["md5sum", "-c", "--quiet", str(files[0])], cwd=dest,
                               capture_output=True, timeout=60)
    assert coreutils.returncode == 0, coreutils.stdout + coreutils.stderr
