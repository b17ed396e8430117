"""The links of an HTML directory listing page, each with the size and mtime its layout ties
to it: the cells of its table row (Apache's HTMLTable, lighttpd, Caddy), or the text after
it on its own line (nginx's and Apache's FancyIndexing <pre>). See sources/autoindex.py for
what is read where, and for the safety rules every link then meets."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

from bulkfetch.sources.autoindex_fields import Found, parse_iso_time, parse_size, parse_time

# The text after a link in a <pre> listing: its date, then its size ('-' for a directory)
_PRE_TAIL = re.compile(r"\s*(\S+\s+\d{2}:\d{2}(?::\d{2})?)\s+(-|\S+)(?=\s|$)")
_TOKEN = re.compile(
    r"<!--.*?(?:-->|\Z)|<(script|style)\b.*?(?:</\1\s*>|\Z)|<[!?][^>]*>"
    r"|<(?P<close>/?)(?P<tag>[A-Za-z][A-Za-z0-9]*)(?P<attrs>(?:[^<>\"']|\"[^\"<]*\"|'[^'<]*')*)>",
    re.DOTALL | re.IGNORECASE)
# One line of a <pre> listing that needs no tokenizer: a plain link and the text after it
_PLAIN_LINE = re.compile(r'<a href="([^"<>&]*)">[^<]*</a>([^<&\n]*)\n')
_ATTRIBUTE = re.compile(r"""([^\s"'>/=]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+)))?""")
# Tags that end the text after a link (the next entry, or the end of the block)
_TAIL_ENDS = frozenset(("a", "tr", "td", "th", "li", "ul", "table", "pre", "hr", "br", "div",
                        "p", "tbody", "body", "html"))


def page_text(body: bytes, content_type: str | None) -> str:
    """The page as text: UTF-8 when it is (what every server named here writes, Apache even
    under a charset=ISO-8859-1 header), else the declared charset, else Latin-1."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    charset = re.search(r"charset=\"?([\w.:-]+)", content_type or "", re.IGNORECASE)
    try:
        return body.decode(charset.group(1) if charset else "latin-1", "replace")
    except LookupError:
        return body.decode("latin-1")


@dataclass(slots=True)
class _Cell:
    attrs: dict[str, str]
    text: list[str] = field(default_factory=list)
    datetime: str | None = None  # of a <time datetime=...> inside (Caddy)


@dataclass(slots=True)
class _Row:
    cells: list[_Cell] = field(default_factory=list)
    links: list[tuple[Found, int]] = field(default_factory=list)  # and the cell it is in


class _LinkCollector:
    """Every <a href> in order, each with the table row it is in or the text after it."""

    def __init__(self) -> None:
        self.found: list[Found] = []
        self.rows: list[_Row] = []
        self.row: _Row | None = None
        self.open: Found | None = None  # a link outside any row, until its </a>
        self.tail: tuple[Found, list[str]] | None = None  # such a link and the text after
        self.tails: list[tuple[Found, list[str]]] = []

    def start(self, tag: str, attrs: str) -> None:
        if tag in _TAIL_ENDS:
            self.tail = self.open = None
        if tag == "tr":
            self.row = _Row()
            self.rows.append(self.row)
        elif tag in ("td", "th") and self.row is not None:
            self.row.cells.append(_Cell(_attributes(attrs)))
        elif tag == "time" and self.row is not None and self.row.cells:
            self.row.cells[-1].datetime = _attributes(attrs).get("datetime")
        elif tag == "a":
            href = _attributes(attrs).get("href")
            if href is None:
                return
            link = Found(href)
            self.found.append(link)
            if self.row is not None and self.row.cells:
                self.row.links.append((link, len(self.row.cells) - 1))
            elif self.row is None:
                self.open = link

    def end(self, tag: str) -> None:
        if tag == "a" and self.open is not None:  # what follows the link's text is its own
            self.tail = (self.open, [])
            self.tails.append(self.tail)
            self.open = None
            return
        if tag in ("tr", "table", "tbody", "thead"):
            self.row = None
        if tag in _TAIL_ENDS:
            self.tail = None

    def data(self, text: str) -> None:
        if self.row is not None and self.row.cells:
            self.row.cells[-1].text.append(text)
        if self.tail is not None:
            line, newline, _ = text.partition("\n")
            self.tail[1].append(line)
            if newline:
                self.tail = None


def _attributes(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in _ATTRIBUTE.finditer(text):
        name = match.group(1).lower()
        if name not in found:  # as browsers: the first of a repeated attribute counts
            value = next((v for v in match.group(2, 3, 4) if v is not None), "")
            found[name] = html.unescape(value) if "&" in value else value
    return found


def _tokens(text: str, into: _LinkCollector) -> None:
    """Feed `text`'s tags and text to `into`. A tokenizer of its own rather than
    html.parser, which takes 66 ms to merely read a 10,000-entry nginx listing (1.3 MB)
    and 130 ms with the handlers: this is the only HTML a listing needs (tags, attributes,
    text; comments, <script> and <style> skipped), linear in the page's length (a tag
    holds no '<'), and hostile markup at worst shows links that the safety rules judge."""
    at = 0
    while (match := _TOKEN.search(text, at)) is not None:
        begin, end = match.span()
        if begin > at and (into.tail is not None or into.row is not None):
            data = text[at:begin]
            into.data(html.unescape(data) if "&" in data else data)
        at = end
        close, tag, attrs = match.group("close", "tag", "attrs")
        if tag is None:  # a comment, a <script> or <style> with its text, a <!...> or <?...>
            continue
        tag = tag.lower()
        if close:
            into.end(tag)
        else:
            into.start(tag, attrs)
            if tag == "pre" and into.row is None:
                at = _plain_lines(text, at, into)
    if at < len(text):
        data = text[at:]
        into.data(html.unescape(data) if "&" in data else data)


def _plain_lines(text: str, at: int, into: _LinkCollector) -> int:
    """Read the lines of a <pre> block from `at` that are each exactly `<a href="H">T</a>
    TAIL` and a newline, with no '&' to decode in H or TAIL (every line nginx writes; T is
    never read), as the tokenizer would (a link outside any row, the text after it on its
    line its own): nginx's 48-entry page in 230 us, not 379 (benchmarks/listing.py). Where
    the next line is anything else (Apache's FancyIndexing starts each with an icon), the
    tokenizer goes on from there. Returns where that is."""
    found, tails = into.found, into.tails
    line = _PLAIN_LINE.match(text, at)
    while line is not None:
        link = Found(line.group(1))
        found.append(link)
        tails.append((link, [line.group(2)]))
        at = line.end()
        line = _PLAIN_LINE.match(text, at)
    return at


def html_links(text: str) -> list[Found]:
    parser = _LinkCollector()
    _tokens(text, parser)
    for row in parser.rows:
        _from_row(row)
    for link, tail in parser.tails:
        match = _PRE_TAIL.match("".join(tail))
        if match is not None:
            link.mtime = parse_time(match.group(1))
            size = parse_size(match.group(2))
            if size is not None:
                link.size, link.size_exact = size
    return parser.found


def _from_row(row: _Row) -> None:
    """A table row's size and mtime, given to its link: only when all of the row's links
    point one place (an icon's link and a name's), so a cell is never given to the wrong
    entry; the link's own cell is never read (a file may be named '12K')."""
    if not row.links or len({link.href for link, _ in row.links}) != 1:
        return
    own = {at for _, at in row.links}
    size: tuple[int, bool] | None = None
    mtime: int | None = None
    for at, cell in enumerate(row.cells):
        if at in own:
            continue
        if size is None:
            stated = cell.attrs.get("data-size") or cell.attrs.get("data-order")
            if stated is not None and stated.isascii() and stated.isdigit():
                size = int(stated), True  # Caddy: the exact size beside the rounded one
            else:
                size = parse_size("".join(cell.text))
        if mtime is None:
            mtime = parse_iso_time(cell.datetime) if cell.datetime is not None \
                else parse_time("".join(cell.text))
    for link, _ in row.links:
        link.mtime = mtime
        if size is not None:
            link.size, link.size_exact = size
