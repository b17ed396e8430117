"""`bulkfetch get` against a hostile reference server: attack names, broken pagination and a
symlink planted in DEST. The real CLI runs in a subprocess over loopback; every file is
checked against the synthetic data set's formula, never against what the client says."""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from getkit import STATE, assert_state_clean, expected_files, get, status, status_counts

from bulkfetch.server.hostile import (
    COLLISION_NAMES,
    MALFORMED_NAMES,
    TRAVERSAL_NAMES,
    hostile_body,
)
from bulkfetch.testing import ReferenceServer

Start = Callable[..., ReferenceServer]


# -- helpers ---------------------------------------------------------------------------------




def md5_of(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def files_under(dest: Path) -> dict[str, Path]:
    """Every regular file or symlink under DEST outside DEST/.bulkfetch, by relative name."""
    found: dict[str, Path] = {}
    for root, dirs, names in os.walk(dest):
        rel_root = Path(root).relative_to(dest)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if d != STATE]
        for entry in names + [d for d in dirs if (Path(root) / d).is_symlink()]:
            found[(rel_root / entry).as_posix().removeprefix("./")] = Path(root) / entry
    return found




def snapshot(root: Path, *excluded: Path) -> dict[str, tuple[str, int]]:
    """Every path under root (files, dirs, symlinks) with its kind and size, minus excluded
    subtrees."""
    root = root.resolve()
    skip = {p.resolve() for p in excluded}
    seen: dict[str, tuple[str, int]] = {}
    for current, dirs, names in os.walk(root):  # never follows symlinks
        dirs[:] = [d for d in dirs if Path(current) / d not in skip]
        for entry in dirs + names:
            path = Path(current) / entry
            st = path.lstat()
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            seen[str(path.relative_to(root))] = (kind, st.st_size if kind == "file" else 0)
    return seen








def journal_totals(dest: Path) -> dict[str, int]:
    uri = (dest / STATE / "journal.sqlite").resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=10)
    try:
        ok, failed, nbytes, done, listed = conn.execute(
            "SELECT coalesce(sum(ok), 0), coalesce(sum(failed), 0), coalesce(sum(bytes), 0), "
            "coalesce(sum(status = 'done'), 0), count(*) FROM pages").fetchone()
        rows = conn.execute("SELECT count(*) FROM failures").fetchone()[0]
    finally:
        conn.close()
    return {"ok": ok, "failed": failed, "bytes": nbytes, "pages_done": done,
            "pages": listed, "failure_rows": rows}


# -- 3. hostile names --------------------------------------------------------------------------
# Each attack name and what its refusal must mention (case-insensitive).
REFUSALS: dict[str, str] = {
    "../x": r"'\.\.'|traversal",
    "a/../../x": r"'\.\.'|traversal",
    "..": r"'\.\.'|traversal",
    "p/..": r"'\.\.'|traversal",
    "/etc/x": r"absolute",
    "~/x": r"~|home",
    "C:x": r"drive letter",
    "\\\\srv\\s": r"backslash",
    "..\\x": r"backslash",
    "nul\x00byte": r"NUL",
    "ctl\x01\x1b[31mred": r"control",
    "bad-utf8-\udcff": r"UTF-8|surrogate",
    "": r"empty",
    "long-" + "x" * 300: r"longer than|too long",
    "/".join(["deep-" + "y" * 200] * 25): r"longer than|too long",
    "trailing-dot.": r"dot",
    "trailing-space ": r"space",
    "\uff0e\uff0e/fullwidth": r"normalis|'\.\.'",
}


def test_hostile_names_are_refused_and_nothing_escapes_dest(reference_server: Start,
                                                            tmp_path: Path) -> None:
    assert set(REFUSALS) == set(TRAVERSAL_NAMES) | set(MALFORMED_NAMES) | {COLLISION_NAMES[4]}
    files = 50
    server = reference_server("--files", str(files), "--hostile-names")
    box = tmp_path / "box"
    dest = box / "dest"
    reports = tmp_path / "reports"
    box.mkdir()
    reports.mkdir()
    (box / "neighbour.txt").write_text("must stay as it is\n")
    home_x = Path.home() / "x"
    outside_before = snapshot(tmp_path, dest, reports)
    absolute_before = (Path("/etc/x").exists(), home_x.exists())

    proc, report = get(server.url, dest, reports / "r.json", "--quiet")

    assert proc.returncode == 1, proc.stderr
    assert report["exit_code"] == 1 and report["error"] is None and report["listing_complete"]
    # nothing created, changed or removed outside DEST
    assert snapshot(tmp_path, dest, reports) == outside_before
    assert (Path("/etc/x").exists(), home_x.exists()) == absolute_before
    assert (box / "neighbour.txt").read_text() == "must stay as it is\n"

    failures: dict[str, dict] = {}
    for failure in report["failures"]:
        assert failure["name"] not in failures, f"{failure['name']!r} reported twice"
        failures[failure["name"]] = failure
    for name, pattern in REFUSALS.items():
        assert name in failures, f"{name!r} not reported as failed"
        assert re.search(pattern, failures[name]["reason"], re.IGNORECASE), (
            name, failures[name]["reason"])
    # `h/x` and `h/x/y` cannot both exist: exactly one is refused, the other is stored intact
    stored = files_under(dest)
    h_failed = [n for n in ("h/x", "h/x/y") if n in failures]
    assert len(h_failed) == 1, h_failed
    assert re.search(r"directory|in the way|not a", failures[h_failed[0]]["reason"], re.I)
    h_ok = ({"h/x", "h/x/y"} - set(h_failed)).pop()
    # NFC and NFD spellings of one name: each is refused or stored with its own body
    accepted = {h_ok}
    for name in ("caf\u00e9", "cafe\u0301"):
        if name not in failures:
            accepted.add(name)
    for name in accepted:
        assert name in stored, f"{name!r} neither stored nor reported failed"
        assert stored[name].read_bytes() == hostile_body(name), name
    expected = expected_files(files)
    assert set(stored) == set(expected) | accepted, set(stored) ^ (set(expected) | accepted)
    for name, digest in expected.items():
        assert not stored[name].is_symlink() and md5_of(stored[name]) == digest, name
    assert set(failures) - set(REFUSALS) <= {"h/x", "h/x/y", "caf\u00e9", "cafe\u0301"}
    assert report["files_failed"] == len(failures) == report["failures_total"]
    # the good files are all reported done; the duplicate of f0000000001 on the same page
    # is fetched and counted once
    listed = files + len(REFUSALS) + len(COLLISION_NAMES) - 1
    assert report["files_ok"] + report["files_failed"] == listed
    assert_state_clean(dest)


# -- 4. broken pagination -------------------------------------------------------------------
BAD_PAGE_ERRORS = {
    "malformed": r"malformed JSON",
    "loop": r"loops",
    "repeat": r"repeats",
    "content-type": r"text/html",
}


def assert_journal_matches_disk(dest: Path, files: int) -> tuple[int, int]:
    """`bulkfetch status` runs and agrees with the journal and with the files on disk."""
    result = status(dest)
    assert result.returncode == 0, result.stderr
    ok, failed, listed = status_counts(result.stdout)
    totals = journal_totals(dest)
    assert (ok, failed) == (totals["ok"], totals["failed"]) and failed == totals["failure_rows"]
    expected = expected_files(files)
    stored = files_under(dest)
    assert ok == len(stored) and failed == 0, (ok, len(stored), failed)
    assert totals["pages_done"] == totals["pages"], "a page left unfinished"
    assert set(stored) <= set(expected)
    for name, path in stored.items():
        assert md5_of(path) == expected[name], name
    assert totals["bytes"] == 100 * ok
    assert_state_clean(dest)
    return ok, listed


@pytest.mark.parametrize("kind", sorted(BAD_PAGE_ERRORS))
def test_bad_pages_fail_clearly_and_consistently(reference_server: Start, tmp_path: Path,
                                                 kind: str) -> None:
    files = 1000
    server = reference_server("--files", str(files), "--page-size", "100", "--bad-pages", kind)
    dest = tmp_path / "dest"
    pattern = BAD_PAGE_ERRORS[kind]
    outcomes = []
    for attempt in range(2):  # the same command twice: the rerun ends the same way
        proc, report = get(server.url, dest, tmp_path / f"r{attempt}.json", "--plain",
                           "--retries", "1")
        assert proc.returncode == 1, (attempt, proc.returncode, proc.stderr[-2000:])
        assert report["exit_code"] == 1 and not report["listing_complete"]
        assert report["error"] and re.search(pattern, report["error"]), report["error"]
        assert re.search(pattern, proc.stderr), proc.stderr[-2000:]
        assert report["files_failed"] == 0
        ok, listed = assert_journal_matches_disk(dest, files)
        assert report["files_ok"] == ok <= files
        status_text = status(dest).stdout
        assert re.search(pattern, status_text), status_text
        outcomes.append((report["files_ok"], listed, report["pages"]))
    assert outcomes[0] == outcomes[1], outcomes


def test_empty_page_with_a_token_is_followed(reference_server: Start, tmp_path: Path) -> None:
    files = 1000
    server = reference_server("--files", str(files), "--page-size", "100", "--bad-pages",
                              "empty")
    dest = tmp_path / "dest"
    proc, report = get(server.url, dest, tmp_path / "r.json", "--quiet", "--retries", "1")
    assert proc.returncode == 0, proc.stderr
    assert report["files_ok"] == files and report["files_failed"] == 0
    assert report["listing_complete"] and report["error"] is None
    assert report["pages"] == files // 100 + 1  # the empty page counts as a (done) page
    stored = files_under(dest)
    expected = expected_files(files)
    assert set(stored) == set(expected)
    assert all(md5_of(stored[n]) == d for n, d in expected.items())
    assert_state_clean(dest)


# -- 5. a symlink planted in DEST -------------------------------------------------------------
def test_symlink_planted_in_dest_is_not_followed(reference_server: Start,
                                                 tmp_path: Path) -> None:
    files = 500
    server = reference_server("--files", str(files), "--nested")
    expected = expected_files(files, nested=True)
    component = next(iter(expected)).split("/")[0]
    trapped = {n for n in expected if n.split("/")[0] == component}
    assert 0 < len(trapped) < files
    box = tmp_path / "box"
    dest = box / "dest"
    outside = tmp_path / "outside"
    reports = tmp_path / "reports"
    for d in (dest, outside, reports):
        d.mkdir(parents=True)
    (outside / "keep").write_text("x")
    (dest / component).symlink_to(outside, target_is_directory=True)
    before = snapshot(tmp_path, dest, reports)

    proc, report = get(server.url, dest, reports / "r.json", "--quiet")

    assert proc.returncode == 1, proc.stderr
    assert snapshot(tmp_path, dest, reports) == before
    assert sorted(os.listdir(outside)) == ["keep"] and (outside / "keep").read_text() == "x"
    assert (dest / component).is_symlink() and os.readlink(dest / component) == str(outside)
    failures = {f["name"]: f["reason"] for f in report["failures"]}
    assert set(failures) == trapped
    assert all("symlink" in reason for reason in failures.values()), failures
    assert report["files_failed"] == len(trapped)
    assert report["files_ok"] == files - len(trapped)
    stored = files_under(dest)
    assert set(stored) == (set(expected) - trapped) | {component}
    for name in set(expected) - trapped:
        assert not stored[name].is_symlink() and md5_of(stored[name]) == expected[name], name
    assert_state_clean(dest)
