"""Reading a destination back: `open_dataset(DEST)` -> a Dataset of (name, bytes).

Two layouts, one API: tar shards read through DEST/index.sqlite (tar.py) and a
directory as the directory sink wrote it (directory.py). Neither follows a symlink planted
in DEST or trusts what it reads: a tar member is checked against the index's MD5, a name
against check_name.

Memory stays flat at any number of files: queries stream from sqlite cursors, and a
directory walk holds one sorted listing per level it is in.
"""

from __future__ import annotations

import os
from pathlib import Path

from bulkfetch.dataset.base import Dataset, MemberInfo, OnError
from bulkfetch.dataset.directory import DirectoryDataset
from bulkfetch.dataset.tar import TarDataset
from bulkfetch.dest import index
from bulkfetch.errors import BulkfetchError, UsageError

__all__ = [
    "Dataset",
    "DirectoryDataset",
    "MemberInfo",
    "OnError",
    "TarDataset",
    "open_dataset",
]


def open_dataset(dest: str | os.PathLike[str], *, fanout: int | None = None) -> Dataset:
    """The files `bulkfetch get` stored in DEST, whichever sink wrote them.

    `fanout` only matters for a directory destination: the number of hash-prefix levels the
    names sit under; by default it is read from DEST's journal (0 without one).
    """
    path = Path(dest)
    if not path.is_dir():
        what = "is not a directory" if os.path.lexists(path) else "does not exist"
        raise UsageError(f"{dest} {what}: give the DEST directory that bulkfetch get "
                         "downloaded into")
    if os.path.lexists(path / index.INDEX_NAME):
        return TarDataset(path)
    sink = _journal_sink(path)
    if sink.get("kind") == "tar":
        raise UsageError(f"{dest} was written by --sink tar but has no {index.INDEX_NAME} "
                         "yet (no shard has been closed): rerun the download to finish it")
    if fanout is None:
        layout = sink.get("fanout", 0)
        fanout = layout if isinstance(layout, int) and 0 <= layout <= 4 else 0
    return DirectoryDataset(path, fanout)


def _journal_sink(dest: Path) -> dict[str, object]:
    """The sink options DEST's journal recorded, or {} without a readable journal."""
    # late: only directory destinations need it
    from bulkfetch.dest.journal_reader import read_status

    try:
        sink = read_status(dest).fingerprint.get("sink")
    except BulkfetchError:
        return {}
    return sink if isinstance(sink, dict) else {}
