"""`bulkfetch ls`, `cat` and `extract` on tar and directory destinations, through the click
commands (CliRunner): output, bytes, trees compared file by file, exit codes, and a tampered
index whose names try to leave OUT."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from bulkfetch.cli import dataset as cli_dataset
from bulkfetch.cli.dataset import cat, extract, ls
from bulkfetch.dest import index
from bulkfetch.testing import write_dir_destination
from bulkfetch.testing import write_tar_destination as build_tar_dest


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def build_dir_dest(dest: Path, files: dict[str, bytes]) -> None:
    write_dir_destination(dest, files)
    (dest / ".bulkfetch").mkdir(exist_ok=True)
    (dest / ".bulkfetch" / "journal.sqlite").write_bytes(b"bulkfetch state")


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under root by relative name, with its bytes; symlinks as markers."""
    found: dict[str, bytes] = {}
    for current, dirs, names in os.walk(root):
        for entry in names + [d for d in dirs if (Path(current) / d).is_symlink()]:
            path = Path(current) / entry
            rel = path.relative_to(root).as_posix()
            found[rel] = b"<symlink>" if path.is_symlink() else path.read_bytes()
    return found


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every path under root with its kind and size (never following symlinks)."""
    seen: dict[str, tuple[str, int]] = {}
    for current, dirs, names in os.walk(root):
        for entry in dirs + names:
            path = Path(current) / entry
            st = path.lstat()
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            seen[path.relative_to(root).as_posix()] = (kind, st.st_size)
    return seen


SHARD_1 = [("readme.md", b"# data\n"), ("img/001.png", b"\x89PNG" + bytes(range(256)) * 4),
           ("naïve/ünïcode.txt", "grüße".encode())]
SHARD_2 = [("img/002.png", b"\x89PNG second"), ("deep/" + "d" * 120 + "/leaf", b"long path"),
           ("zero", b"")]
FILES = dict(SHARD_1 + SHARD_2)
ORDER = [n for n, _ in SHARD_1 + SHARD_2]


@pytest.fixture
def tar_dest(tmp_path: Path) -> Path:
    dest = tmp_path / "tar-dest"
    build_tar_dest(dest, [SHARD_1, SHARD_2])
    return dest


@pytest.fixture
def dir_dest(tmp_path: Path) -> Path:
    dest = tmp_path / "dir-dest"
    build_dir_dest(dest, FILES)
    return dest


def run(command: click.Command, *args: str | Path) -> Result:
    return CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=False)


# -- ls ---------------------------------------------------------------------------------------


def test_ls_lists_names_in_storage_order(tar_dest: Path, dir_dest: Path) -> None:
    result = run(ls, tar_dest)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ORDER
    result = run(ls, dir_dest)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "deep/" + "d" * 120 + "/leaf", "img/001.png", "img/002.png", "naïve/ünïcode.txt",
        "readme.md", "zero"]


def test_ls_pattern_and_long(tar_dest: Path, dir_dest: Path) -> None:
    result = run(ls, tar_dest, "img/*")
    assert result.stdout.splitlines() == ["img/001.png", "img/002.png"]
    assert run(ls, tar_dest, "*.jpg").stdout == ""

    conn = index.connect(tar_dest)
    where = dict(conn.execute("SELECT m.name, s.file FROM members m JOIN shards s "
                              "ON s.id = m.shard"))
    conn.close()
    for dest, shard_of in ((tar_dest, where), (dir_dest, dict.fromkeys(FILES, "-"))):
        result = run(ls, dest, "--long")
        assert result.exit_code == 0, result.output
        rows = [line.split("\t") for line in result.stdout.splitlines()]
        assert len(rows) == len(FILES)
        for size, digest, shard, name in rows:
            assert int(size) == len(FILES[name])
            assert digest == md5(FILES[name])
            assert shard == shard_of[name]


def test_ls_escapes_hostile_names(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    hostile = ["plain", "two\nlines", "\x1b[31mred", "back\\slash"]
    build_tar_dest(dest, [[(name, b"x") for name in hostile]])
    result = run(ls, dest)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines == ["plain", repr("two\nlines"), repr("\x1b[31mred"), repr("back\\slash")]
    assert "\x1b" not in result.stdout


def test_ls_usage_errors(tmp_path: Path) -> None:
    result = run(ls, tmp_path / "missing")
    assert result.exit_code == 2
    assert "does not exist" in result.stderr and "missing" in result.stderr
    (tmp_path / "file").write_bytes(b"")
    result = run(ls, tmp_path / "file")
    assert result.exit_code == 2 and "is not a directory" in result.stderr


# -- cat --------------------------------------------------------------------------------------


def test_cat_writes_exact_bytes(tar_dest: Path, dir_dest: Path) -> None:
    names = ["img/001.png", "zero", "naïve/ünïcode.txt", "img/001.png"]
    for dest in (tar_dest, dir_dest):
        result = run(cat, dest, *names)
        assert result.exit_code == 0, result.stderr
        assert result.stdout_bytes == b"".join(FILES[n] for n in names)
        assert result.stderr == ""


def test_cat_missing_name_still_prints_the_others(tar_dest: Path) -> None:
    result = run(cat, tar_dest, "readme.md", "no/such", "img/002.png")
    assert result.exit_code == 1
    assert result.stdout_bytes == FILES["readme.md"] + FILES["img/002.png"]
    assert "no/such is not in" in result.stderr


def test_cat_refuses_corrupt_bytes(tar_dest: Path) -> None:
    conn = index.connect(tar_dest)
    offset, file = conn.execute("SELECT m.offset, s.file FROM members m JOIN shards s "
                                "ON s.id = m.shard WHERE m.name = 'img/002.png'").fetchone()
    conn.close()
    with open(tar_dest / file, "r+b") as shard:
        shard.seek(offset)
        shard.write(b"X")
    result = run(cat, tar_dest, "img/002.png", "readme.md")
    assert result.exit_code == 1
    assert result.stdout_bytes == FILES["readme.md"]  # nothing of the damaged file
    assert "MD5 mismatch" in result.stderr and "img/002.png" in result.stderr


def test_cat_needs_a_name(tar_dest: Path) -> None:
    assert run(cat, tar_dest).exit_code == 2


# -- extract ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tar", "dir"])
def test_extract_reproduces_every_file(kind: str, tar_dest: Path, dir_dest: Path,
                                       tmp_path: Path) -> None:
    dest = tar_dest if kind == "tar" else dir_dest
    out = tmp_path / "out" / "nested"  # created, parents too
    result = run(extract, dest, out)
    assert result.exit_code == 0, result.stderr
    assert tree(out) == FILES  # every byte of every file, and nothing else
    assert not (out / ".bulkfetch").exists()  # the sink's temporary directory is gone
    total = sum(len(b) for b in FILES.values())
    assert f"extracted {len(FILES)} files (" in result.stderr
    assert f"{total:,} bytes)" in result.stderr
    assert "0 failed" in result.stderr


def test_extract_only_and_existing_out(tar_dest: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "img").mkdir(parents=True)
    (out / "img" / "001.png").write_bytes(b"stale")
    (out / "mine.txt").write_bytes(b"kept")
    (out / ".bulkfetch" / "tmp").mkdir(parents=True)
    (out / ".bulkfetch" / "tmp" / "someone-else").write_bytes(b"not ours")
    result = run(extract, tar_dest, out, "--only", "img/*")
    assert result.exit_code == 0, result.stderr
    assert tree(out) == {"img/001.png": FILES["img/001.png"],
                         "img/002.png": FILES["img/002.png"], "mine.txt": b"kept",
                         ".bulkfetch/tmp/someone-else": b"not ours"}
    assert "extracted 2 files" in result.stderr


def test_extract_refuses_tampered_names(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    evil = ["../evil", "/etc/x", "a/../../evil2", ".bulkfetch/tmp/x", "ok/../../../evil3",
            "nul\x00byte", "C:evil", "~/evil"]
    build_tar_dest(dest, [[("good/one", b"1")] + [(n, b"EVIL") for n in evil[:3]],
                          [(n, b"EVIL") for n in evil[3:]] + [("good/two", b"22")]])
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    (out.parent / "bystander").write_bytes(b"untouched")
    root_before = snapshot(tmp_path)

    result = run(extract, dest, out, "-q")
    assert result.exit_code == 1
    assert tree(out) == {"good/one": b"1", "good/two": b"22"}
    after = snapshot(tmp_path)
    new = {path: kind for path, kind in after.items() if path not in root_before}
    assert all(path.startswith("work/out/") or path == "work/out" for path in new), new
    assert {p: k for p, k in after.items() if p in root_before} == root_before
    failures = [line for line in result.stderr.splitlines() if line.startswith("failed: ")]
    assert len(failures) == len(evil)
    assert any("../evil: refused: empty, '.' or '..' path component" in f for f in failures)
    assert any("/etc/x: refused: absolute path" in f for f in failures)
    assert any(".bulkfetch/tmp/x: refused:" in f for f in failures)
    assert "\x00" not in result.stderr
    assert "extracted" not in result.stderr  # -q: no summary


def test_extract_never_writes_through_a_symlink_in_out(tar_dest: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "img").symlink_to(outside, target_is_directory=True)
    result = run(extract, tar_dest, out)
    assert result.exit_code == 1
    assert list(outside.iterdir()) == []
    assert "img/001.png" in result.stderr and "symlink" in result.stderr
    assert "4 files" in result.stderr and "2 failed" in result.stderr


def test_extract_skips_and_reports_damaged_members(tar_dest: Path, tmp_path: Path) -> None:
    conn = index.connect(tar_dest)
    conn.execute("UPDATE members SET md5 = ? WHERE name = 'readme.md'", (md5(b"other"),))
    conn.close()
    (tar_dest / "shard-000-000002.tar").unlink()
    out = tmp_path / "out"
    result = run(extract, tar_dest, out)
    assert result.exit_code == 1
    assert tree(out) == {n: b for n, b in SHARD_1 if n != "readme.md"}
    assert "MD5 mismatch" in result.stderr and "missing" in result.stderr
    assert "4 failed" in result.stderr


def test_extract_usage_errors(tar_dest: Path, dir_dest: Path, tmp_path: Path) -> None:
    cases = [
        (tar_dest, tar_dest / "inside", "or inside it"),
        (dir_dest, dir_dest, "or inside it"),
        (dir_dest, tmp_path, "is inside"),  # OUT contains DEST
        (tar_dest, tar_dest / "shard-000-000001.tar", "not a directory"),
        (tmp_path / "nothing", tmp_path / "out", "does not exist"),
    ]
    for dest, out, message in cases:
        before = snapshot(tmp_path)
        result = run(extract, dest, out)
        assert result.exit_code == 2, (dest, out, result.stderr)
        assert message in result.stderr
        assert snapshot(tmp_path) == before  # nothing created


def test_extract_shows_progress_lines(tar_dest: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_dataset, "PROGRESS_INTERVAL_S", 0.0)
    result = run(extract, tar_dest, tmp_path / "out")
    lines = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert lines and lines[-1].split("] ")[1].startswith(f"{len(FILES)} of {len(FILES)} files")
    assert "[" not in run(extract, tar_dest, tmp_path / "out2", "--quiet").stderr


def test_through_the_installed_cli(tar_dest: Path, tmp_path: Path) -> None:
    python = [sys.executable, "-m", "bulkfetch"]
    listed = subprocess.run([*python, "ls", str(tar_dest)], capture_output=True, check=True)
    assert listed.stdout.decode().splitlines() == ORDER
    shown = subprocess.run([*python, "cat", str(tar_dest), "img/001.png"], capture_output=True,
                           check=True)
    assert shown.stdout == FILES["img/001.png"]
    out = tmp_path / "out"
    subprocess.run([*python, "extract", str(tar_dest), str(out)], capture_output=True,
                   check=True)
    assert tree(out) == FILES
