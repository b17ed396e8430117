"""`bulkfetch serve --shape index` and `--shape index-json`: the synthetic data set as a web
server's directory tree under /archive/, each directory listed as nginx's autoindex lists it
(https://nginx.org/en/docs/http/ngx_http_autoindex_module.html): `index` as its HTML
(autoindex_format html, autoindex_exact_size on), `index-json` as autoindex_format json.
What a crawler of directory listings (`wget -r -np`, rclone's http backend) is tested on.

The tree: file i of N lives in leaf directory i // F (F: --index-fanout, 50 unless told),
and the leaf directories are themselves laid out F to a directory, as deep as it takes
(D levels: the least D with F**D leaf directories or more; none when N <= F), named dNNN by
their place in their parent. So every directory lists at most F entries, and with F = 50:

    /archive/f0000000007                     N <= 50: the files at the top
    /archive/d003/f0000000157                N <= 2,500: one level
    /archive/d000/d003/f0000000157           N <= 125,000: two levels (1,000,000: three)

A file's name is the data set's, its bytes, ETag, Range, conditional answers and faults the
seed API's, as for every shape. A directory's page is computed from its place (the names of
its at most F entries), so a data set of any size starts at once and memory stays flat.

    GET /archive/[dNNN/...]       the listing: text/html (<pre> of '<a href="NAME">NAME</a>',
                                  the date in GMT, the size in bytes, '-' for a directory,
                                  byte for byte nginx's layout) or application/json
                                  ([{"name", "type": "file"|"directory", "mtime": RFC 1123,
                                  "size" (files)}], nginx's too)
    GET /archive/dNNN             301 to /archive/dNNN/ (absolute), as nginx answers
    GET /archive/[dNNN/...]NAME   the file's bytes

--stale-rate misstates a listed file's size as it does in other listings (the listings state
no digest, so --lie-md5 is refused with these shapes). The fault switches apply to listing
pages as to the other shapes' list pages, and to files as files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import formatdate
from urllib.parse import quote, unquote

from bulkfetch.server.app import App, Response
from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.server.shapes import ShapeApp

ROOT = "/archive/"
DEFAULT_FANOUT = 50
MAX_FANOUT = 100_000
NAME_COLUMN = 50  # nginx pads (or cuts) a listed name to 50 characters


@dataclass(frozen=True, slots=True)
class Listed:
    """One entry of a directory page."""

    name: str
    is_dir: bool
    mtime: int  # Unix time
    size: int = 0  # files only


class Tree:
    """Where each of `files` files lives, `fanout` entries to a directory (the docstring)."""

    def __init__(self, files: int, fanout: int) -> None:
        if not 2 <= fanout <= MAX_FANOUT:
            raise ValueError(f"fanout must be 2..{MAX_FANOUT}, got {fanout}")
        self.files, self.fanout = files, fanout
        self.leaves = max(1, -(-files // fanout))  # an empty data set: an empty /archive/
        self.depth, span = 0, 1
        while span < self.leaves:
            span *= fanout
            self.depth += 1
        self.width = max(3, len(str(fanout - 1)))

    def dir_name(self, digit: int) -> str:
        return f"d{digit:0{self.width}d}"

    def digits(self, leaf: int) -> list[int]:
        """The place of leaf directory `leaf`: one digit (base fanout) a level, top first."""
        found = []
        for _ in range(self.depth):
            leaf, digit = divmod(leaf, self.fanout)
            found.append(digit)
        return found[::-1]

    def path(self, index: int, name: str) -> str:
        """The URL path of file `index` (named `name`)."""
        dirs = "".join(self.dir_name(d) + "/" for d in self.digits(index // self.fanout))
        return f"{ROOT}{dirs}{name}"

    def directory(self, segments: list[str]) -> tuple[int, int] | None:
        """(level, number among its level) of the directory at `segments` ('dNNN' each),
        None if there is none."""
        if len(segments) > self.depth:
            return None
        number = 0
        for segment in segments:
            digits = segment[1:]
            if len(segment) != self.width + 1 or segment[0] != "d" or not digits.isascii() \
                    or not digits.isdigit() or int(digits) >= self.fanout:
                return None
            number = number * self.fanout + int(digits)
        level = len(segments)
        if number * self.fanout ** (self.depth - level) >= self.leaves:
            return None
        return level, number

    def subdirectories(self, level: int, number: int) -> range:
        """The numbers (on the next level) of the directories in directory (level, number)."""
        span = self.fanout ** (self.depth - level - 1)
        first = number * self.fanout
        return range(first, min(first + self.fanout, -(-self.leaves // span)))

    def file_indices(self, number: int) -> range:
        """The files in leaf directory `number`."""
        first = number * self.fanout
        return range(first, min(first + self.fanout, self.files))


# -- what nginx writes ---------------------------------------------------------------------
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _html_escape(text: str) -> str:
    # nginx's NGX_ESCAPE_HTML: these four, nothing else
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") \
        .replace('"', "&quot;")


def nginx_html(path: str, entries: list[Listed]) -> bytes:
    """The page nginx's autoindex (html, exact sizes, GMT) writes for directory `path`."""
    lines = [f"<html>\r\n<head><title>Index of {_html_escape(path)}</title></head>\r\n"
             f"<body>\r\n<h1>Index of {_html_escape(path)}</h1><hr><pre>"
             '<a href="../">../</a>\r\n']
    for entry in entries:
        # Counted in bytes, as nginx counts without 'charset utf-8' (and cut, mid-character
        # as nginx cuts, where longer)
        shown_bytes = (entry.name + "/" * entry.is_dir).encode("utf-8", "surrogateescape")
        if len(shown_bytes) > NAME_COLUMN:
            shown_bytes = shown_bytes[:NAME_COLUMN - 3] + b"..>"
        shown = shown_bytes.decode("utf-8", "surrogateescape")
        stamp = time.gmtime(entry.mtime)
        size = "-" if entry.is_dir else str(entry.size)
        lines.append(
            f'<a href="{quote(entry.name, safe="")}{"/" * entry.is_dir}">'
            f"{_html_escape(shown)}</a>"
            f'{" " * (NAME_COLUMN - len(shown_bytes))} '
            f"{stamp.tm_mday:02d}-{_MONTHS[stamp.tm_mon - 1]}-{stamp.tm_year} "
            f"{stamp.tm_hour:02d}:{stamp.tm_min:02d} {size:>19}\r\n")
    lines.append("</pre><hr></body>\r\n</html>\r\n")
    return "".join(lines).encode("utf-8", "surrogateescape")


def nginx_json(entries: list[Listed]) -> bytes:
    """The page nginx's autoindex_format json writes."""
    items = []
    for entry in entries:
        item = (f'{{ "name":{json.dumps(entry.name, ensure_ascii=False)}, '
                f'"type":"{"directory" if entry.is_dir else "file"}", '
                f'"mtime":"{formatdate(entry.mtime, usegmt=True)}"')
        items.append(item + (" }" if entry.is_dir else f', "size":{entry.size} }}'))
    return ("[\r\n" + ",\r\n".join(items) + ("\r\n" if items else "") + "]").encode("utf-8")


# -- the shapes ----------------------------------------------------------------------------
class IndexApp(ShapeApp):
    """The data set as a tree of nginx HTML listings (module docstring)."""

    shape = "index"
    CONTENT_TYPE = "text/html"

    def __init__(self, app: App, fallback_origin: str, fanout: int = DEFAULT_FANOUT) -> None:
        super().__init__(app, fallback_origin)
        dataset = app.dataset
        if not isinstance(dataset, SyntheticDataSet) or dataset.nested:
            raise ValueError(f"--shape {self.shape} lays out the flat synthetic data set only")
        self.dataset = dataset
        self.tree = Tree(dataset.files, fanout)

    def error(self, status: int, message: str,
              extra: list[tuple[str, str]] | None = None) -> Response:
        # nginx's own error page, whatever the listing format
        title = f"{status} {message}"
        body = (f"<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n"
                f"<center><h1>{title}</h1></center>\r\n<hr><center>nginx</center>\r\n"
                "</body>\r\n</html>\r\n").encode()
        return Response(status, [("Content-Type", "text/html"), *(extra or [])], body)

    def file_target(self, target: str) -> bool:
        return self._file(unquote(target.partition("?")[0])) is not None

    def route(self, method: str, target: str, headers: dict[str, str]) -> Response:
        path = unquote(target.partition("?")[0])
        if path == ROOT.rstrip("/"):
            return self._moved(path, headers)
        if not path.startswith(ROOT):
            return self.error(404, "Not Found")
        segments = path[len(ROOT):].split("/")
        if segments[-1] == "":  # a directory's page
            place = self.tree.directory(segments[:-1])
            if place is None:
                return self.error(404, "Not Found")
            return self.list_page(method, target, headers, lambda: self._page(path, *place))
        if self.tree.directory(segments) is not None:
            return self._moved(path, headers)
        index = self._file(path)
        if index is None:
            return self.error(404, "Not Found")
        return self.file(quote(self.dataset.name(index)), method, target, headers)

    def _file(self, path: str) -> int | None:
        """The index of the file at `path`, if one is there."""
        if not path.startswith(ROOT):
            return None
        name = path.rpartition("/")[2]
        index = self.dataset.index_of(name)
        if index is None or self.tree.path(index, name) != path:
            return None
        return index

    def _moved(self, path: str, headers: dict[str, str]) -> Response:
        location = f"{self.origin(headers)}{quote(path)}/"
        return self.error(301, "Moved Permanently", [("Location", location)])

    def entries(self, level: int, number: int) -> Iterator[Listed]:
        """The entries of directory (level, number), as nginx orders them (by name; the
        directories hold either directories or files, never both)."""
        modified = self.dataset.last_modified
        if level < self.tree.depth:
            for child in self.tree.subdirectories(level, number):
                yield Listed(self.tree.dir_name(child % self.tree.fanout), True, modified)
            return
        for index in self.tree.file_indices(number):
            name = self.dataset.name(index)
            size = self.dataset.size(index)
            kind = self.misstate(name) if self.misstate is not None else None
            yield Listed(name, False, self.dataset.modified(self.dataset.version(index)),
                         size + (kind == "size"))

    def _page(self, path: str, level: int, number: int) -> Response:
        body = self.render(path, list(self.entries(level, number)))
        return Response(200, [("Content-Type", self.CONTENT_TYPE)], body)

    def render(self, path: str, entries: list[Listed]) -> bytes:
        return nginx_html(path, entries)


class IndexJsonApp(IndexApp):
    """The same tree, listed as nginx's autoindex_format json."""

    shape = "index-json"
    CONTENT_TYPE = "application/json"

    def render(self, path: str, entries: list[Listed]) -> bytes:
        return nginx_json(entries)


INDEX_APPS: dict[str, type[IndexApp]] = {"index": IndexApp, "index-json": IndexJsonApp}
