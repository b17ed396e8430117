"""Rows of a Parquet table, a page at a time, never a whole row group in memory.

Parquet is read by pyarrow (the `parquet` extra). A page asks for rows [start, start + n) of
a few columns. They are read in batches of n rows (only those columns) from a stream over
the row groups that stays open for the next page, which starts where this one ended; only
the page's rows become Python objects. Reading whole row groups instead cost the main
process 27 MB more at 1,000,000 rows in groups of 100,000 (benchmarks/table_resume.py).
A row's place is its index in the whole table, so resuming at row N opens the stream at the
group holding N, never at the top.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from typing import Any

from bulkfetch.errors import UsageError


class ParquetRows:
    def __init__(self, path: str) -> None:
        # The system allocator gives back what a batch used; pyarrow's default (mimalloc)
        # kept 27 MB more at the peak of reading 1,000,000 rows (130 against 103 MB). Only
        # when pyarrow is not loaded yet and the user chose no pool: never the caller's.
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
        try:
            import pyarrow
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError(f"--from-file {path!r}: reading Parquet needs pyarrow; install "
                             "it with: pip install 'bulkfetch[parquet]'") from None
        self.path = path
        self.errors: tuple[type[BaseException], ...] = (OSError, pyarrow.ArrowException)
        try:
            # Column chunks read through a 256 KiB buffer, not whole (pre_buffer): what a
            # page holds then stays flat whatever the row groups' size (2.9 MB at groups of
            # 50,000 and of 200,000 rows, against 4.5 and 5.8 MB read whole).
            self.file = pq.ParquetFile(path, buffer_size=1 << 18, pre_buffer=False)
        except self.errors as exc:
            raise UsageError(f"--from-file {path!r}: not a Parquet file pyarrow can read: "
                             f"{exc}") from None
        meta = self.file.metadata
        self.total = meta.num_rows
        self.starts = [0]  # the first row of each row group
        for group in range(meta.num_row_groups):
            self.starts.append(self.starts[-1] + meta.row_group(group).num_rows)
        self.columns: list[str] = list(self.file.schema_arrow.names)
        self.stream: Iterator[Any] | None = None  # record batches from row `at` on
        self.at = 0
        self.stream_columns: tuple[str, ...] = ()
        self.left: Any = None  # the rest of the last batch read, from row `at`

    def read(self, start: int, count: int, columns: tuple[str, ...]) -> dict[str, list[Any]]:
        """Column -> values of rows [start, start + count) (fewer at the table's end).
        Raises self.errors on a broken file."""
        found: dict[str, list[Any]] = {column: [] for column in columns}
        if self.stream is None or (self.at, self.stream_columns) != (start, columns):
            self._open(start, count, columns)
        wanted = min(count, self.total - start)
        while wanted > 0:
            batch = self.left if self.left is not None else next(self.stream, None)
            self.left = None
            if batch is None:  # the footer promised rows the groups do not hold
                break
            piece = batch.slice(0, wanted)
            for column in columns:
                found[column].extend(piece.column(column).to_pylist())
            if piece.num_rows < batch.num_rows:
                self.left = batch.slice(piece.num_rows)
            self.at += piece.num_rows
            wanted -= piece.num_rows
        return found

    def _open(self, start: int, count: int, columns: tuple[str, ...]) -> None:
        """A stream of batches of `count` rows from the group holding row `start`, moved on
        to `start` (the rows before it in that group are read and dropped)."""
        group = bisect.bisect_right(self.starts, start) - 1
        self.stream = self.left = None
        self.stream = iter(self.file.iter_batches(
            batch_size=max(1, count), row_groups=range(group, len(self.starts) - 1),
            columns=list(columns), use_threads=False))
        self.stream_columns, self.at = columns, self.starts[group]
        while self.at < start:
            batch = next(self.stream, None)
            if batch is None:
                break
            if self.at + batch.num_rows > start:
                self.left = batch.slice(start - self.at)
                self.at = start
            else:
                self.at += batch.num_rows
