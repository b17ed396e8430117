"""DestBefore: a run stopped at once on the user's mistake leaves DEST as it found it, and
never removes what another run holds."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from bulkfetch.dest import index
from bulkfetch.dest.journal import STATE_DIR
from bulkfetch.dest.lock import LOCK_NAME
from bulkfetch.runners.dest import DestBefore


def made_by_a_run(dest: Path) -> Path:
    """What a run leaves before it stops: its state directory, lock and a tar index."""
    (dest / STATE_DIR / "tmp").mkdir(parents=True)
    (dest / STATE_DIR / LOCK_NAME).write_text("")
    (dest / index.INDEX_NAME).write_bytes(b"")
    return dest / STATE_DIR / LOCK_NAME


def test_a_dest_the_run_made_is_removed(tmp_path: Path) -> None:
    dest = tmp_path / "new"
    before = DestBefore.note(dest)
    made_by_a_run(dest)
    before.restore()
    assert not dest.exists()


def test_what_was_there_before_stays(tmp_path: Path) -> None:
    dest = tmp_path / "old"
    dest.mkdir()
    (dest / "mine.txt").write_text("mine")
    before = DestBefore.note(dest)
    made_by_a_run(dest)
    before.restore()
    assert sorted(os.listdir(dest)) == ["mine.txt"]


def test_an_earlier_journal_and_index_are_never_removed(tmp_path: Path) -> None:
    dest = tmp_path / "resumed"
    made_by_a_run(dest)
    before = DestBefore.note(dest)
    before.restore()
    assert (dest / STATE_DIR / LOCK_NAME).exists() and (dest / index.INDEX_NAME).exists()


def test_nothing_is_removed_while_another_run_holds_the_lock(tmp_path: Path) -> None:
    dest = tmp_path / "raced"
    before = DestBefore.note(dest)  # both runs began on a new DEST ...
    lock = made_by_a_run(dest)  # ... and the other one made the journal and holds it
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before.restore()
        assert lock.exists() and (dest / index.INDEX_NAME).exists()
    finally:
        os.close(fd)
    before.restore()  # once it let go
    assert not dest.exists()
