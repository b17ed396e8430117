"""bulkfetch bench: verification of a row's destination against the export."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from bulkfetch.bench.verify import (
    Check,
    combine,
    count_files,
    export_names,
    sample,
    verify_counted,
    verify_dir,
    verify_report,
    verify_tar,
)

NAMES = [f"f{i:010d}" for i in range(25)]


def body(name: str) -> bytes:
    return f"body of {name}\n".encode() * 3


@pytest.fixture
def export(tmp_path: Path) -> Path:
    """An export's layout: pages/first, pages/next/<token>, files/<name>; pages of 10."""
    root = tmp_path / "export"
    (root / "pages" / "next").mkdir(parents=True)
    (root / "files").mkdir()
    pages = [NAMES[i:i + 10] for i in range(0, len(NAMES), 10)]
    for number, names in enumerate(pages):
        page: dict[str, object] = {"FileNames": names}
        if number + 1 < len(pages):
            page["NextMarker"] = f"tok{number + 1}"
        path = root / "pages" / ("first" if number == 0 else f"next/tok{number}")
        path.write_text(json.dumps(page))
        for name in names:
            (root / "files" / name).write_bytes(body(name))
    return root


def copy(dest: Path, names: list[str]) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        (dest / name).write_bytes(body(name))
    return dest


def test_export_names_follow_the_pages(export: Path) -> None:
    assert list(export_names(export)) == NAMES
    assert list(export_names(export, 12)) == NAMES[:12]
    assert list(export_names(export, 10)) == NAMES[:10]
    assert list(export_names(export, 0)) == []


def test_sample_spreads_over_all_names() -> None:
    names = [str(i) for i in range(1000)]
    picked = sample(names, 200)
    assert len(picked) == 200 == len(set(picked))
    assert picked[0] == "0" and picked[-1] == "999"
    assert sample(names[:5], 200) == names[:5]


def test_a_complete_copy_is_verified(export: Path, tmp_path: Path) -> None:
    dest = copy(tmp_path / "d", NAMES)
    (dest / ".bulkfetch").mkdir()  # the journal is not a file of the data set
    (dest / ".bulkfetch" / "journal.sqlite").write_bytes(b"x")
    check = verify_dir(dest, export, len(NAMES))
    assert check.ok, check
    assert str(check) == "yes: 25 files, 25 MD5s sampled, 0 wrong"
    assert verify_dir(copy(tmp_path / "s", NAMES[:12]), export, 12).ok  # a subset


def test_a_missing_file_or_a_wrong_byte_fails(export: Path, tmp_path: Path) -> None:
    short = copy(tmp_path / "short", NAMES[:-1])
    assert not verify_dir(short, export, len(NAMES)).ok
    wrong = copy(tmp_path / "wrong", NAMES)
    (wrong / NAMES[3]).write_bytes(b"not it")
    check = verify_dir(wrong, export, len(NAMES))
    assert not check.ok and "1 wrong" in check.detail
    extra = copy(tmp_path / "extra", NAMES)
    (extra / "leftover.part").write_bytes(b"")
    assert not verify_dir(extra, export, len(NAMES)).ok
    assert not verify_dir(tmp_path / "absent", export, len(NAMES)).ok


def test_count_files_descends_into_subdirectories(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x").write_bytes(b"")
    (tmp_path / "y").write_bytes(b"")
    assert count_files(tmp_path) == 2


def make_tar_dest(dest: Path, names: list[str], corrupt: str | None = None) -> Path:
    """A shard holding the bodies back to back and an index pointing into it."""
    dest.mkdir()
    data = b""
    rows = []
    for name in names:
        content = b"X" * len(body(name)) if name == corrupt else body(name)
        rows.append((name, 1, len(data), len(content), hashlib.md5(content).hexdigest()))
        data += content
    (dest / "shard-000-000001.tar").write_bytes(data)
    conn = sqlite3.connect(dest / "index.sqlite")
    conn.executescript("CREATE TABLE shards (id INTEGER PRIMARY KEY, file TEXT);"
                       "CREATE TABLE members (name TEXT, shard INTEGER, offset INTEGER, "
                       "size INTEGER, md5 TEXT);")
    conn.execute("INSERT INTO shards VALUES (1, 'shard-000-000001.tar')")
    conn.executemany("INSERT INTO members VALUES (?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    return dest


def test_tar_members_are_read_back_by_offset(export: Path, tmp_path: Path) -> None:
    good = verify_tar(make_tar_dest(tmp_path / "t", NAMES), export, len(NAMES))
    assert good.ok, good
    assert good.detail == "25 indexed in 1 shards, 25 MD5s sampled, 0 wrong"
    bad = verify_tar(make_tar_dest(tmp_path / "b", NAMES, corrupt=NAMES[7]), export, 25)
    assert not bad.ok and "1 wrong" in bad.detail
    assert not verify_tar(make_tar_dest(tmp_path / "s", NAMES[:-2]), export, 25).ok
    assert verify_tar(tmp_path / "none", export, 25) == Check(False, "no index.sqlite")


def test_report_and_counts(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"files_ok": 100, "exit_code": 0}))
    assert verify_report(report, 100).ok
    assert not verify_report(report, 101).ok
    report.write_text(json.dumps({"files_ok": 100, "exit_code": 1}))
    assert not verify_report(report, 100).ok
    assert verify_report(tmp_path / "missing.json", 1) == Check(False, "no report")
    assert verify_counted('noise\n{"files": 7, "bad": 0}\n', 7).ok
    assert not verify_counted('{"files": 7, "bad": 1}', 8).ok
    assert not verify_counted("Traceback ...", 7).ok
    assert not verify_counted("", 7).ok
    # curl_loop's line
    assert verify_counted('{"ok": 7, "failed": 0, "bytes": 700, "seconds": 0.1}', 7).ok
    assert not verify_counted('{"ok": 7, "failed": 2, "bytes": 700}', 7).ok
    assert not verify_counted('{"ok": 6, "failed": 0}', 7).ok


def test_combine() -> None:
    both = combine(Check(True, "a"), Check(False, "b"))
    assert both == Check(False, "a; b")
    assert combine(Check(True, "a"), Check(True, "b")).ok
