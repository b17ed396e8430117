"""sources/autoindex_html.py: the lane for a <pre> listing's plain lines (nginx's, Apache's
FancyIndexing) reads every page exactly as the tokenizer alone does, takes the lines it is
for, and hands every other line back to the tokenizer where it stands."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkfetch.sources import autoindex_html
from bulkfetch.sources.autoindex_html import html_links, page_text

FIXTURES = Path(__file__).parent / "fixtures" / "autoindex"
PAGES = sorted(path.name for path in FIXTURES.glob("*.html"))

NGINX_LINE = '<a href="f{0:05d}.bin">f{0:05d}.bin</a>{1}29-Nov-2026 11:45{1}{2}\r\n'
# Pages made to walk the edges between the lane and the tokenizer
CRAFTED = {
    "mixed": "<pre><a href=\"../\">../</a>\r\n"
             "<a href=\"a%26b.txt\">a&amp;b.txt</a>   01-Jan-2025 00:00   7\r\n"
             "<a href=\"c.txt\">c.txt</a>   01-Jan-2025 00:01   9\r\n"
             "<a href=\"d.txt\">d.txt</a>   01-Jan-2025 00:02   1&nbsp;\r\n"
             "<a href=\"e.txt\">e.txt</a>   01-Jan-2025 00:03   12K\r\n</pre>",
    "no final newline": "<pre><a href=\"a\">a</a> 01-Jan-2025 00:00 5\n"
                        "<a href=\"b\">b</a> 01-Jan-2025 00:00 6</pre>",
    "icons and attributes": "<pre><img src=\"x.gif\"> <a href=\"a\">a</a> 01-Jan-2025 00:00 5\n"
                            "<a href=\"b\" class=\"f\">b</a> 01-Jan-2025 00:00 6\n"
                            "<a href=\"c\">c</a> 01-Jan-2025 00:00 7\n</pre>",
    "a comment between lines": "<pre><a href=\"a\">a</a> 01-Jan-2025 00:00 5\n<!-- "
                               "<a href=\"hidden\">x</a> 1\n--><a href=\"b\">b</a> 2\n</pre>",
    "upper case and a row": "<table><tr><td><PRE><a href=\"a\">a</a> 01-Jan-2025 00:00 5\n"
                            "</PRE></td><td>9</td></tr></table><pre><a href=\"b\">b</a> 6\n",
    "two lines on one": "<pre><a href=\"a\">a</a> 5 <a href=\"b\">b</a> 6\n"
                        "<a href=\"c\">c</a>\n\n<a href=\"d\">d</a>   -\n</pre>",
    "a link as the tail": "<pre><a href=\"a\">a</a>\n<a href=\"b\">b</a><a href=\"c\">c</a> 3\n"
                          "</pre><p>after <a href=\"d\">d</a> 4\n",
}


def tokenizer_only(text: str, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    with monkeypatch.context() as patched:
        patched.setattr(autoindex_html, "_plain_lines", lambda text, at, into: at)
        return html_links(text)


def lines_taken(text: str, monkeypatch: pytest.MonkeyPatch) -> int:
    taken = 0
    lane = autoindex_html._plain_lines

    def counted(text: str, at: int, into: object) -> int:
        nonlocal taken
        before = len(into.found)
        end = lane(text, at, into)
        taken += len(into.found) - before
        return end

    with monkeypatch.context() as patched:
        patched.setattr(autoindex_html, "_plain_lines", counted)
        html_links(text)
    return taken


@pytest.mark.parametrize("page", PAGES)
def test_every_real_servers_page_reads_as_the_tokenizer_alone_reads_it(
        page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = page_text((FIXTURES / page).read_bytes(), "text/html")
    assert html_links(text) == tokenizer_only(text, monkeypatch)


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_every_edge_of_the_lane_reads_as_the_tokenizer_alone_reads_it(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    found = html_links(CRAFTED[name])
    assert found == tokenizer_only(CRAFTED[name], monkeypatch)
    assert found  # the page has links: a lane that lost them all would pass the line above


def test_the_lane_takes_nginxs_plain_lines_and_leaves_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # nginx's real page: every line ('&amp;' in a link's text is never read: the name is
    # its href's)
    text = page_text((FIXTURES / "nginx-exact.html").read_bytes(), "text/html")
    assert lines_taken(text, monkeypatch) == len(html_links(text)) == 16
    # up to the line whose tail holds an entity: the tokenizer reads the block from there
    assert lines_taken(CRAFTED["mixed"], monkeypatch) == 3
    # a large listing: every line
    page = "<html><body><h1>Index of /d/</h1><hr><pre><a href=\"../\">../</a>\r\n" + "".join(
        NGINX_LINE.format(i, " " * 20, 100 + i) for i in range(1000)) + "</pre><hr></body>"
    found = html_links(page)
    assert lines_taken(page, monkeypatch) == 1001 == len(found)
    assert (found[-1].href, found[-1].size, found[-1].size_exact) == ("f00999.bin", 1099, True)
    assert found[-1].mtime == 1795952700  # 2026-11-29 11:45 UTC
