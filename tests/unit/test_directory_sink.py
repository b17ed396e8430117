"""The directory sink on its own: files appear whole under their names, replace what a
previous run left, never follow a planted symlink, and leave no temporary files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkfetch.sinks.base import SinkFailure
from bulkfetch.sinks.directory import TMP_DIR, DirectorySink


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[DirectorySink]:
    dest = tmp_path / "dest"
    (dest / TMP_DIR).mkdir(parents=True)
    made = DirectorySink(dest, 0)
    yield made
    made.close()
    assert os.listdir(dest / TMP_DIR) == []


def test_files_land_whole_in_subdirectories(sink: DirectorySink) -> None:
    sink.write("a/b/c.bin", b"x" * 5000)
    sink.write("top", b"")
    assert (sink.dest / "a/b/c.bin").read_bytes() == b"x" * 5000
    assert (sink.dest / "top").read_bytes() == b""
    assert oct((sink.dest / "top").stat().st_mode & 0o777) == "0o644"


def test_a_rerun_replaces_the_old_file(sink: DirectorySink) -> None:
    sink.write("f", b"old body")
    sink.write("f", b"new")
    assert (sink.dest / "f").read_bytes() == b"new"


def test_a_planted_symlink_is_replaced_not_followed(sink: DirectorySink,
                                                   tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (sink.dest / "f").symlink_to(outside)
    sink.write("f", b"downloaded")
    assert outside.read_text() == "keep me"
    assert not (sink.dest / "f").is_symlink()
    assert (sink.dest / "f").read_bytes() == b"downloaded"


def test_a_directory_in_the_way_is_a_failure(sink: DirectorySink) -> None:
    (sink.dest / "d" / "inner").mkdir(parents=True)
    with pytest.raises(SinkFailure, match="directory is in the way"):
        sink.write("d", b"x")
    assert (sink.dest / "d" / "inner").is_dir()
