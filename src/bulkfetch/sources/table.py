"""`--from-file TABLE.csv|.tsv|.jsonl|.parquet`: a table of URLs, one row per file, streamed
page by page.

The URL is in column --url-col (default `url`). The file's name is column --name-col, or
--name-template filled with the row's `index` (from 0, in file order) and the URL's `ext`
(`.jpg`, or "" when its last path component has none): img2dataset's `{index:09d}{ext}`
names files that share a last path component apart. Without either, the name is the URL's
path, as for a plain URL list. CSV and TSV need a header row naming the columns; a JSONL
line is a JSON object; Parquet is read a row group at a time (parquet.py). A page's token is
`OFFSET:INDEX`, the byte where its first row starts and that row's index (Parquet: the
index alone), so resuming never rereads the table from the top (unless names come from a
column or from URLs: then one read finds names two URLs give, and the later row is a
failure naming both, as for a URL list). A listed item is
`name NUL url`; a row that cannot give a URL becomes `name NUL NUL reason`, a failure of its
own. With --save-cols a row also gives `<key>.json NUL data:...`: the chosen columns as a
JSON object, carried in the listing (a data: URL) and stored without a transfer, next to the
row's file so that webdataset reads both as one sample.
"""

from __future__ import annotations

import base64
import csv
import json
import posixpath
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from bulkfetch.config import TableOptions
from bulkfetch.errors import UsageError
from bulkfetch.sources.abilities import Abilities
from bulkfetch.sources.collisions import collision_reason, first_urls
from bulkfetch.sources.listed import ListedPage, ListingError
from bulkfetch.sources.parquet import ParquetRows
from bulkfetch.sources.urllist import url_name
from bulkfetch.util.samples import split_key

ROWS_PER_PAGE = 1000
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".parquet": "parquet"}
JSON_DATA = "data:application/json;base64,"

# A row as read: (URL, the name column's value or "", the --save-cols values or None), or a
# str saying why a line is not a row.
Row = tuple[str, str, dict[str, Any] | None] | str
# ... with the line its row begins on (1 for the file's first; None where a journal of an
# older bulkfetch resumes without line numbers)
Lined = tuple[int | None, Row]


def table_format(path: str) -> str | None:
    """"csv", "tsv", "jsonl" or "parquet" by the file's extension; None for a URL list."""
    return FORMATS.get(posixpath.splitext(path.lower())[1])


def _extension(url: str) -> str:
    """The URL path's extension (`.jpg`), by string search: this runs once per row."""
    path = url.partition("?")[0].partition("#")[0]
    leaf = path[path.rfind("/") + 1:]
    dot = leaf.rfind(".")
    return unquote(leaf[dot:]) if dot > 0 else ""


class TableSource:
    def __init__(self, path: str, options: TableOptions,
                 rows_per_page: int = ROWS_PER_PAGE, listing: bool = True) -> None:
        kind = table_format(path)
        if kind is None:
            raise UsageError(f"--from-file {path!r}: not a .csv, .tsv, .jsonl or .parquet "
                             "table")
        self.path = path
        self.kind = kind
        self.options = options
        self.rows_per_page = rows_per_page
        self.columns: list[str] = []
        self.body_start = 0  # the byte after the header row (CSV, TSV)
        self.header_lines = 0  # ... and the lines it took
        self.parquet: ParquetRows | None = None
        self.first_url: dict[str, str] | None = None  # see _check_collisions()
        if not listing:  # a worker only resolves the items: no header, and no pyarrow
            return
        try:
            with open(path, "rb") as handle:
                if kind in ("csv", "tsv"):
                    self.columns, self.body_start = self._header(handle)
        except OSError as exc:
            raise UsageError(f"--from-file {path!r}: {exc.strerror}") from None
        if kind == "parquet":
            self.parquet = ParquetRows(path)
            self.columns = self.parquet.columns
        if kind != "jsonl":
            named = [("--url-col", options.url_col), ("--name-col", options.name_col),
                     *(("--save-cols", column) for column in options.save_cols)]
            for flag, column in named:
                if column is not None and column not in self.columns:
                    raise UsageError(
                        f"--from-file {path!r}: {flag} {column!r} is not a column of its "
                        f"{'schema' if kind == 'parquet' else 'header'} "
                        f"({', '.join(map(repr, self.columns)) or 'empty'})")

    def _header(self, handle: IO[bytes]) -> tuple[list[str], int]:
        lines = _CountedLines(handle, bom=True)
        try:
            header = next(csv.reader(lines, delimiter=self._delimiter(), strict=True), [])
        except csv.Error as exc:
            raise UsageError(f"--from-file {self.path!r}: the header row is malformed ({exc})"
                             ) from None
        self.header_lines = lines.count
        return header, lines.consumed

    def _delimiter(self) -> str:
        return "\t" if self.kind == "tsv" else ","

    def describe(self) -> str:
        return f"URLs in column {self.options.url_col!r} of {self.path}"

    def abilities(self) -> Abilities:
        return Abilities()

    def list_page(self, token: str | None) -> ListedPage:
        self._check_collisions()  # in the lister only: workers just resolve()
        if self.parquet is not None:
            return self._parquet_page(int(token) if token else 0)
        # (offset of the page's first row, its index, the lines before it): a journal of an
        # older bulkfetch holds tokens without the lines
        if token:
            parts = [int(part) for part in token.split(":")]
            offset, index, before = parts[0], parts[1], parts[2] if len(parts) > 2 else None
        else:
            offset, index, before = self.body_start, 0, self.header_lines
        items: list[str] = []
        lines: _CountedLines | None = None
        rows = 0
        try:
            with open(self.path, "rb") as handle:
                handle.seek(offset)
                lines = _CountedLines(handle)
                for line, row in self._rows(lines, before):
                    items += self._items(index, row, line)
                    index += 1
                    rows += 1
                    if rows == self.rows_per_page:
                        break
                more = handle.read(1) != b""
        except OSError as exc:
            raise ListingError(f"reading {self.path}: {exc.strerror}", retryable=False) from None
        following = f"{offset + lines.consumed}:{index}"
        if before is not None:
            following += f":{before + lines.count}"
        return ListedPage(tuple(items), following if more else None)

    def _parquet_page(self, index: int) -> ListedPage:
        assert self.parquet is not None
        options = self.options
        wanted = tuple(dict.fromkeys(c for c in (options.url_col, options.name_col,
                                                 *options.save_cols) if c is not None))
        try:
            values = self.parquet.read(index, self.rows_per_page, wanted)
        except self.parquet.errors as exc:
            raise ListingError(f"reading {self.path} at row {index}: {exc}",
                               retryable=False) from None
        urls = values[options.url_col]
        names = values[options.name_col] if options.name_col else repeat(None)
        saved = [values[c] for c in options.save_cols]
        items: list[str] = []
        for at, (url, name) in enumerate(zip(urls, names, strict=False)):  # names: repeat()
            kept = {c: column[at] for c, column in zip(options.save_cols, saved, strict=True)} \
                if saved else None
            items += self._items(index + at, ("" if url is None else str(url),
                                              "" if name is None else str(name), kept))
        following = index + len(urls)
        return ListedPage(tuple(items), str(following) if following < self.parquet.total
                          else None)

    def _rows(self, lines: _CountedLines, before: int | None) -> Iterator[Lined]:
        """The rows from where `lines` starts, each with the line it begins on (`before`:
        the lines before that point, None when unknown). A line or a CSV row that is not a
        row of the table (not JSON; an unterminated quote, fields after a closing quote; more
        or fewer fields than the header) is a str saying so: its row fails on its own, named
        by its lines, and the rows after it are read on."""
        url_col, name_col = self.options.url_col, self.options.name_col
        save_cols = self.options.save_cols

        def line_of(count: int) -> int | None:
            return None if before is None else before + count + 1

        if self.kind == "jsonl":
            for line in lines:
                where = line_of(lines.count - 1)
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    yield where, f"not JSON: {exc}"
                    continue
                if not isinstance(row, dict):
                    yield where, "not a JSON object"
                    continue
                url, name = row.get(url_col), row.get(name_col) if name_col else None
                yield where, ("" if url is None else str(url), "" if name is None else str(name),
                              {c: row.get(c) for c in save_cols} if save_cols else None)
            return
        at = self.columns.index(url_col)
        named = self.columns.index(name_col) if name_col is not None else -1
        kept = [(c, self.columns.index(c)) for c in save_cols]
        columns = len(self.columns)
        delimiter = self._delimiter()
        reader = csv.reader(lines, delimiter=delimiter, strict=True)
        while True:
            start, at_byte = lines.count, lines.consumed
            try:
                values = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                # The row fails alone, and the rows after it are read from the line after
                # its first: an unterminated quote would otherwise take every line up to the
                # next quote in the file (all of them, if there is none) with it.
                yield line_of(start), f"malformed ({exc}); read on from the line after it"
                lines.rewind(at_byte, start)
                lines.skip_line()
                reader = csv.reader(lines, delimiter=delimiter, strict=True)
                continue
            if not values:
                continue
            if len(values) != columns:
                yield line_of(start), (f"{len(values)} fields where the header has "
                                       f"{columns}")
                continue
            yield line_of(start), (values[at], values[named] if named >= 0 else "",
                                   {c: values[i] for c, i in kept} if kept else None)

    def _items(self, index: int, row: Row, line: int | None = None) -> list[str]:
        """The row's item, and its --save-cols JSON item when it has a URL."""
        label = f"row {index}" + (f" (line {line})" if line is not None else "")
        if isinstance(row, str):
            return [f"row {index}\0\0{label}: {row}"]
        url = row[0].strip()
        name = self._name(index, url, row[1])
        if "\0" in name or "\0" in url:  # NUL separates an item's parts: never in one
            which = "name" if "\0" in name else "URL"
            return [f"{name.replace(chr(0), '?') or f'row {index}'}\0\0{label}: its "
                    f"{which} holds a NUL character"]
        if not url:
            return [f"{name or f'row {index}'}\0\0{label}: no URL in column "
                    f"{self.options.url_col!r}"]
        if not name and self.options.name_col is not None:
            return [f"row {index}\0\0{label}: no name in column "
                    f"{self.options.name_col!r}"]
        if row[2] is not None or not url.startswith(("http://", "https://")):
            # Checked here, not only in resolve(): a row whose URL cannot be fetched gets no
            # JSON, and a data: URL in the table must not pass for one this source made.
            problem = _url_problem(url)
            if problem is not None:
                return [f"{name}\0\0{problem}"]
        if self.first_url:
            earlier = self.first_url.get(name, url)
            if earlier != url:
                return [f"{name}\0\0{collision_reason(name, url, earlier)}"]
        if row[2] is None:
            return [f"{name}\0{url}"]
        return [f"{name}\0{url}", f"{sidecar_name(name)}\0{JSON_DATA}{_json64(row[2])}"]

    def _name(self, index: int, url: str, named: str) -> str:
        options = self.options
        if options.name_col is not None:
            return named
        if options.name_template is not None:
            return options.name_template.format(index=index, ext=_extension(url))
        try:
            return url_name(urlsplit(url).path)
        except ValueError:  # e.g. a broken [IPv6] host: the row fails on its own (resolve())
            return f"row {index}"

    def _check_collisions(self) -> None:
        """Names from a column or from URLs may repeat (a template with {index} cannot): find
        the names two URLs give, once, before the first page (collisions.py)."""
        if self.first_url is not None:
            return
        template = self.options.name_template
        self.first_url = {} if template is not None and "{index" in template else \
            first_urls(self._named_rows)

    def _named_rows(self) -> Iterator[tuple[str, str]]:
        """(name, URL) of every row with a URL, in table order."""
        if self.parquet is not None:
            wanted = tuple(dict.fromkeys(c for c in (self.options.url_col,
                                                     self.options.name_col) if c))
            for start in range(0, self.parquet.total, 65536):
                try:
                    values = self.parquet.read(start, 65536, wanted)
                except self.parquet.errors as exc:
                    raise ListingError(f"reading {self.path} at row {start}: {exc}",
                                       retryable=False) from None
                names = values[self.options.name_col] if self.options.name_col else \
                    repeat("")
                for at, (url, named) in enumerate(zip(values[self.options.url_col], names,
                                                      strict=False)):
                    if url:
                        yield self._name(start + at, str(url).strip(), str(named)), \
                            str(url).strip()
            return
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.body_start)
                for index, (_, row) in enumerate(self._rows(_CountedLines(handle), None)):
                    if not isinstance(row, str) and row[0].strip():
                        yield self._name(index, row[0].strip(), row[1]), row[0].strip()
        except OSError as exc:
            raise ListingError(f"reading {self.path}: {exc.strerror}", retryable=False) from None
        except csv.Error as exc:
            raise ListingError(f"{self.path}: {exc}", retryable=False) from None

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        return None

    def resolve(self, item: str) -> tuple[str, str]:
        name, _, rest = item.partition("\0")
        if rest.startswith("\0"):
            raise ValueError(rest[1:])
        if rest.startswith(JSON_DATA):  # a --save-cols item: the data this source made
            return name, rest
        problem = _url_problem(rest)
        if problem is not None:
            raise ValueError(problem)
        return name, rest


def _url_problem(url: str) -> str | None:
    """Why a table's URL cannot be fetched, or None."""
    if "\0" in url:  # libcurl takes none
        return "a URL holding a NUL character"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. "http://[::1/x"
        return f"{exc}: {url!r}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http:// or https:// URL: {url!r}"
    return None


def sidecar_name(name: str) -> str:
    """Where a row's --save-cols JSON goes: its sample key plus .json (`a/0042.jpg` ->
    `a/0042.json`; a file that is itself `<key>.json` gets `<key>.meta.json`)."""
    key = split_key(name)[0]
    return f"{key}.meta.json" if name == f"{key}.json" else f"{key}.json"


def _json64(values: dict[str, Any]) -> str:
    # default=str: Parquet dates, decimals and bytes are written as text, never refused
    text = json.dumps(values, ensure_ascii=False, default=str, separators=(",", ":"))
    return base64.b64encode(text.encode("utf-8", "surrogateescape")).decode("ascii")


class _CountedLines:
    """The decoded lines of a binary file, counting the bytes read: csv.reader asks for a
    line only when a row needs it, so after a row the count ends exactly at its end."""

    def __init__(self, handle: IO[bytes], bom: bool = False) -> None:
        self.handle = handle
        self.start = handle.tell()
        self.consumed = 0
        self.count = 0  # lines read
        self.bom = bom  # the first line may start with a UTF-8 byte-order mark

    def rewind(self, consumed: int, count: int) -> None:
        """Back to where `consumed` bytes and `count` lines had been read."""
        self.handle.seek(self.start + consumed)
        self.consumed, self.count = consumed, count

    def skip_line(self) -> None:
        raw = self.handle.readline()
        self.consumed += len(raw)
        self.count += 1 if raw else 0

    def __iter__(self) -> Iterator[str]:
        for raw in iter(self.handle.readline, b""):
            self.consumed += len(raw)
            self.count += 1
            yield raw.decode("utf-8-sig" if self.bom else "utf-8", "surrogateescape")
            self.bom = False
