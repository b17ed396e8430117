"""Rows of a Parquet table, a page at a time, one row group in memory at most.

Parquet is read by pyarrow (the `parquet` extra). A page asks for rows [start, start + n) of
a few columns: the row group holding them is read (only those columns) and kept for the
next page, which usually falls in the same group; only the page's slice becomes Python
objects. A row's place is its index in the whole table, so resuming at row N reads from the
group holding N and never from the top.
"""

from __future__ import annotations

import bisect
from typing import Any

from bulkfetch.errors import UsageError


class ParquetRows:
    def __init__(self, path: str) -> None:
        try:
            import pyarrow
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError(f"--from-file {path!r}: reading Parquet needs pyarrow; install "
                             "it with: pip install 'bulkfetch[parquet]'") from None
        self.path = path
        self.errors: tuple[type[BaseException], ...] = (OSError, pyarrow.ArrowException)
        try:
            self.file = pq.ParquetFile(path)
        except self.errors as exc:
            raise UsageError(f"--from-file {path!r}: not a Parquet file pyarrow can read: "
                             f"{exc}") from None
        meta = self.file.metadata
        self.total = meta.num_rows
        self.starts = [0]  # the first row of each row group
        for group in range(meta.num_row_groups):
            self.starts.append(self.starts[-1] + meta.row_group(group).num_rows)
        self.columns: list[str] = list(self.file.schema_arrow.names)
        self.cached: tuple[int, tuple[str, ...], Any] | None = None

    def read(self, start: int, count: int, columns: tuple[str, ...]) -> dict[str, list[Any]]:
        """Column -> values of rows [start, start + count) (fewer at the table's end).
        Raises self.errors on a broken file."""
        found: dict[str, list[Any]] = {column: [] for column in columns}
        index, end = start, min(start + count, self.total)
        while index < end:
            group = bisect.bisect_right(self.starts, index) - 1
            table = self._group(group, columns)
            offset = index - self.starts[group]
            piece = table.slice(offset, min(end - index, table.num_rows - offset))
            if piece.num_rows == 0:  # the footer promised rows the group does not hold
                break
            for column in columns:
                found[column].extend(piece.column(column).to_pylist())
            index += piece.num_rows
        return found

    def _group(self, group: int, columns: tuple[str, ...]) -> Any:
        if self.cached is None or self.cached[:2] != (group, columns):
            self.cached = None  # the old group goes before the new one is read
            self.cached = (group, columns, self.file.read_row_group(group, columns=list(columns)))
        return self.cached[2]
