"""dest/sums.py on a real DEST: the latest line of each path wins across sums files, names
that md5sum must escape come back as they were, a line that is no MD5 line is counted and
skipped, and a rewrite that cannot finish leaves every older sums file in place (they hold
the only record of what DEST's files are)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from bulkfetch.dest import sums
from bulkfetch.dest.sums import KEPT_TABLE, SUMS_DIR, load_latest, rewrite, sums_files
from bulkfetch.util.checksum_lines import sum_lines

A, B, C = "a" * 32, "b" * 32, "c" * 32
ODD = ("back\\slash", "new\nline", "carriage\rreturn", "plain name", "é/日本")


def write_sums(dest: Path, number: int, entries: list[tuple[str, str]],
               extra: bytes = b"") -> Path:
    """A sums file as the sink writes them; `number` orders them (its mtime)."""
    folder = dest / SUMS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"w0-{number}.md5"
    path.write_bytes(sum_lines(entries) + extra)
    os.utime(path, ns=(10**18 + number * 10**9, 10**18 + number * 10**9))
    return path


def loaded(dest: Path) -> sqlite3.Connection:
    """A private database holding load_latest()'s tables for DEST."""
    db = sqlite3.connect("", isolation_level=None)
    db.execute(KEPT_TABLE)
    load_latest(db, dest)
    return db


def kept(dest: Path) -> tuple[dict[str, str], sums.Loaded]:
    db = sqlite3.connect("", isolation_level=None)
    db.execute(KEPT_TABLE)
    loaded = load_latest(db, dest)
    found = dict(db.execute("SELECT path, md5 FROM kept").fetchall())
    db.close()
    return found, loaded


def test_the_latest_line_of_a_path_wins_and_improper_lines_are_counted(tmp_path: Path) -> None:
    write_sums(tmp_path, 1, [(A, "x"), (A, "y")])
    write_sums(tmp_path, 2, [(B, "x")], extra=b"not a line\n" + b"d" * 40 + b"  sha1\n")
    found, loaded = kept(tmp_path)
    assert found == {"x": B, "y": A}
    assert loaded.lines == 3 and loaded.improper == 2
    assert set(loaded.files) == {"w0-1.md5", "w0-2.md5"}


def test_names_md5sum_escapes_come_back_as_they_were(tmp_path: Path) -> None:
    write_sums(tmp_path, 1, [(C, name) for name in ODD])
    found, loaded = kept(tmp_path)
    assert found == dict.fromkeys(ODD, C) and loaded.improper == 0


def test_a_rewrite_writes_one_file_of_the_latest_lines_and_removes_the_others(
        tmp_path: Path) -> None:
    write_sums(tmp_path, 1, [(A, name) for name in ODD])
    write_sums(tmp_path, 2, [(B, ODD[0])])
    db = loaded(tmp_path)
    compacted = rewrite(db, tmp_path)
    assert sums_files(tmp_path) == [compacted]
    found, _ = kept(tmp_path)
    assert found == {**dict.fromkeys(ODD, A), ODD[0]: B}


@pytest.mark.parametrize("failing", ["rename", "fsync"])
def test_a_rewrite_that_cannot_finish_keeps_every_older_sums_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    older = [write_sums(tmp_path, 1, [(A, "x")]), write_sums(tmp_path, 2, [(B, "y")])]
    db = loaded(tmp_path)

    def refuse(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sums.os, failing, refuse)
    with pytest.raises(OSError, match="No space left"):
        rewrite(db, tmp_path)
    monkeypatch.undo()
    assert sums_files(tmp_path) == older  # the record of DEST's files is whole
    assert sorted(p.name for p in (tmp_path / SUMS_DIR).iterdir()) == ["w0-1.md5", "w0-2.md5"]
    assert kept(tmp_path)[0] == {"x": A, "y": B}


def test_a_sums_file_that_cannot_be_read_leaves_the_table_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_sums(tmp_path, 1, [(A, "x")])
    db = loaded(tmp_path)
    write_sums(tmp_path, 2, [(B, "x")])
    real_open = Path.open

    def unreadable(self: Path, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if self.name == "w0-2.md5":
            raise OSError(5, "Input/output error")
        return real_open(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", unreadable)
    with pytest.raises(OSError, match="Input/output"):
        load_latest(db, tmp_path)
    assert dict(db.execute("SELECT path, md5 FROM kept").fetchall()) == {"x": A}


def test_has_sums_is_true_only_for_a_sums_file(tmp_path: Path) -> None:
    assert sums.has_sums(tmp_path) is False  # no .bulkfetch/sums at all
    (tmp_path / SUMS_DIR).mkdir(parents=True)
    (tmp_path / SUMS_DIR / "notes.txt").write_text("")
    assert sums.has_sums(tmp_path) is False  # the directory, but no sums file in it
    (tmp_path / SUMS_DIR / "0001.md5").write_text("")
    assert sums.has_sums(tmp_path) is True


def test_no_sums_directory_is_no_sums_files(tmp_path: Path) -> None:
    assert sums_files(tmp_path) == []
    found, loaded = kept(tmp_path)
    assert found == {} and loaded == sums.Loaded({}, 0, 0)


def test_lines_are_counted_once_across_batches(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sums, "_BATCH", 2)  # five lines: two full batches and one of one
    write_sums(tmp_path, 1, [(A, f"f{i}") for i in range(5)])
    found, loaded = kept(tmp_path)
    assert loaded.lines == 5 and len(found) == 5


def test_loading_again_forgets_what_the_last_load_found(tmp_path: Path) -> None:
    first = write_sums(tmp_path, 1, [(A, "gone")])
    db = loaded(tmp_path)
    db.execute("INSERT INTO validators SELECT path, '\"e1\"', '', written FROM kept")
    first.unlink()
    write_sums(tmp_path, 2, [(B, "new")])
    load_latest(db, tmp_path)
    assert dict(db.execute("SELECT path, md5 FROM kept").fetchall()) == {"new": B}
    assert db.execute("SELECT count(*) FROM validators").fetchone()[0] == 0


def test_a_load_that_fails_ends_its_transaction(tmp_path: Path) -> None:
    write_sums(tmp_path, 1, [(A, "x")])
    (tmp_path / SUMS_DIR / "w0-2.md5").mkdir()  # cannot be read as a file
    db = sqlite3.connect("", isolation_level=None)
    db.execute(KEPT_TABLE)
    with pytest.raises(IsADirectoryError):
        load_latest(db, tmp_path)
    assert not db.in_transaction  # rolled back: the connection is usable again
    db.execute("BEGIN")
    db.execute("ROLLBACK")


def test_a_rewrite_that_cannot_finish_leaves_no_validators_file_either(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_sums(tmp_path, 1, [(A, "x")])
    db = loaded(tmp_path)
    db.execute("INSERT INTO validators SELECT path, '\"e1\"', '', written FROM kept")

    def refuse(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sums.os, "rename", refuse)
    with pytest.raises(OSError, match="No space left"):
        rewrite(db, tmp_path)
    assert sorted(p.name for p in (tmp_path / SUMS_DIR).iterdir()) == ["w0-1.md5"]


def test_compact_keeps_the_latest_line_of_each_path_in_one_file(tmp_path: Path) -> None:
    write_sums(tmp_path, 1, [(A, "x"), (A, "y")])
    write_sums(tmp_path, 2, [(B, "x")])
    sums.compact(tmp_path)
    assert len(sums_files(tmp_path)) == 1
    assert kept(tmp_path)[0] == {"x": B, "y": A}
