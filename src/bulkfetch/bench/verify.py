"""Correctness of a benchmark row, so no row wins by dropping files: the file count equals
the row's, and the MD5 of a sample of files equals the export's.

The names come from the export's own list pages (pages/first, pages/next/<token>), in the
order every client lists them, so a row over a subset is checked against the first N names.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SAMPLE = 200


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{'yes' if self.ok else 'NO'}: {self.detail}"


def export_names(export: Path, files: int | None = None) -> Iterator[str]:
    """The first `files` names (all with None) of the export, in listing order."""
    page = export / "pages" / "first"
    left = files
    while left is None or left > 0:
        data = json.loads(page.read_bytes())
        names = data["FileNames"] if left is None else data["FileNames"][:left]
        yield from names
        if left is not None:
            left -= len(names)
        token = data.get("NextMarker")
        if not token:
            return
        page = export / "pages" / "next" / token


def sample(names: list[str], size: int = SAMPLE) -> list[str]:
    """`size` names spread evenly over `names`, first and last included."""
    if len(names) <= size:
        return list(names)
    step = (len(names) - 1) / (size - 1)
    return [names[round(i * step)] for i in range(size)]


def md5_file(path: Path) -> str | None:
    try:
        return hashlib.md5(path.read_bytes()).hexdigest()
    except OSError:
        return None


def count_files(dest: Path, skip: tuple[str, ...] = (".bulkfetch",)) -> int:
    """Regular files under `dest` (not following symlinks), not counting the top-level
    entries in `skip`."""
    total = 0
    stack = [str(dest)] if dest.is_dir() else []
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                if directory == str(dest) and entry.name in skip:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += 1
    return total


def verify_dir(dest: Path, export: Path, files: int, size: int = SAMPLE) -> Check:
    """DEST holds exactly `files` files and the sampled ones match the export byte for byte
    (by MD5)."""
    picks = sample(list(export_names(export, files)), size)
    present = count_files(dest)
    wrong = sum(1 for name in picks
                if md5_file(dest / name) != md5_file(export / "files" / name))
    ok = present == files and wrong == 0 and files > 0
    return Check(ok, f"{present:,} files, {len(picks)} MD5s sampled, {wrong} wrong")


def verify_tar(dest: Path, export: Path, files: int, size: int = SAMPLE) -> Check:
    """DEST/index.sqlite indexes `files` distinct names; sampled members read back from their
    shards by offset match the export (by MD5)."""
    index = dest / "index.sqlite"
    if not index.is_file():
        return Check(False, "no index.sqlite")
    conn = sqlite3.connect(index.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        (indexed,) = conn.execute("SELECT count(DISTINCT name) FROM members").fetchone()
        shards = dict(conn.execute("SELECT id, file FROM shards"))
        picks = sample(list(export_names(export, files)), size)
        wrong = 0
        for name in picks:
            row = conn.execute("SELECT shard, offset, size FROM members WHERE name = ?",
                               (name,)).fetchone()
            if row is None or row[0] not in shards:
                wrong += 1
                continue
            shard, offset, length = row
            with open(dest / shards[shard], "rb") as handle:
                handle.seek(offset)
                body = handle.read(length)
            wrong += hashlib.md5(body).hexdigest() != md5_file(export / "files" / name)
    except sqlite3.Error as exc:
        return Check(False, f"index unreadable: {exc}")
    finally:
        conn.close()
    ok = indexed == files and wrong == 0 and files > 0
    return Check(ok, f"{indexed:,} indexed in {len(shards)} shards, {len(picks)} MD5s "
                     f"sampled, {wrong} wrong")


def verify_report(report: Path, files: int) -> Check:
    """bulkfetch's --report: `files` ok, none failed, exit code 0 (the null sink checks every
    body's MD5 against the ETag itself)."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return Check(False, "no report")
    ok_files = data.get("files_ok")
    ok = ok_files == files and data.get("exit_code") == 0 and files > 0
    shown = f"{ok_files:,}" if isinstance(ok_files, int) else repr(ok_files)
    return Check(ok, f"report: {shown} ok, exit {data.get('exit_code')}")


def verify_counted(stdout: str, files: int) -> Check:
    """A design's or a floor loop's last stdout line: {"files": done, "bad": failed}
    (benchmarks/baselines.py) or {"ok": done, "failed": failed} (benchmarks/curl_loop.c)."""
    try:
        counts = json.loads(stdout.strip().splitlines()[-1])
        done = int(counts["ok"] if "ok" in counts else counts["files"])
        bad = int(counts["failed"] if "failed" in counts else counts["bad"])
    except (ValueError, IndexError, KeyError, TypeError):
        return Check(False, "no counts printed")
    return Check(done == files and bad == 0, f"{done:,} done, {bad} failed")


def combine(*checks: Check) -> Check:
    return Check(all(c.ok for c in checks), "; ".join(c.detail for c in checks))
