"""sources/autoindex.py (with autoindex_html.py and autoindex_fields.py): directory listing
pages captured from the real servers (nginx 1.22.1 html exact and inexact, json and xml;
Apache 2.4.71 plain, FancyIndexing and HTMLTable; lighttpd 1.4.69; Caddy 2.6.2 html and
json; python 3.11 http.server), all of the same tree of odd names, each read exactly; then
every safety rule on pages made to break it."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from bulkfetch.sources.autoindex import ListingFormatError, parse_listing
from bulkfetch.sources.autoindex_fields import parse_iso_time, parse_size, parse_time

FIXTURES = Path(__file__).parent / "fixtures" / "autoindex"
JAN_1 = 1735689600  # 2025-01-01T00:00:00Z
# The tree every fixture lists (its files' mtimes: JAN_1 + 3660 s times their sorted place)
SIZES = {
    "100%.bin": 12345, "<tag>&quot.txt": 4, "a b.txt": 5, "a&b.txt": 7, "a&copy.txt": 6,
    "a-very-long-file-name-that-runs-past-the-fifty-column-limit-of-nginx.txt": 123,
    "c+d.txt": 0, "café.txt": 1024, "hash#tag.txt": 11, "plain.dat": 9999, "q?x.txt": 9,
    "ten-thousand.dat": 10000, "日本.txt": 3145745,
}
MTIMES = {name: JAN_1 + 3660 * at for at, name in enumerate(sorted(SIZES))}
DIRS = ["sub dir", "ünï"]
DIR_MTIME = JAN_1 + 86400
# name -> size as the page rounds it, for the pages that round
NGINX_INEXACT = {"100%.bin": 12 << 10, "ten-thousand.dat": 10 << 10, "日本.txt": 3 << 20}
APACHE = {"100%.bin": 12 << 10, "café.txt": 1024, "plain.dat": round(9.8 * 1024),
          "ten-thousand.dat": round(9.8 * 1024), "日本.txt": 3 << 20}
LIGHTTPD = {name: round(float(shown) * 1024) for name, shown in (
    ("100%.bin", "12"), ("<tag>&quot.txt", ".1"), ("a b.txt", ".1"), ("a&b.txt", ".1"),
    ("a&copy.txt", ".1"),
    ("a-very-long-file-name-that-runs-past-the-fifty-column-limit-of-nginx.txt", ".1"),
    ("c+d.txt", "0"), ("café.txt", "1"), ("hash#tag.txt", ".1"), ("plain.dat", "9.7"),
    ("q?x.txt", ".1"), ("ten-thousand.dat", "9.7"))} | {"日本.txt": 3 << 20}
NGINX_ORDER = sorted(SIZES, key=lambda name: name.encode())  # nginx: byte order, dirs first
APACHE_TABLE_ORDER = [  # VersionSort
    "日本.txt", "100%.bin", "<tag>&quot.txt", "a&b.txt", "a&copy.txt",
    "a-very-long-file-name-that-runs-past-the-fifty-column-limit-of-nginx.txt", "a b.txt",
    "c+d.txt", "café.txt", "hash#tag.txt", "plain.dat", "q?x.txt", "ten-thousand.dat"]

# fixture: (Content-Type it came with, URL it came from, rounded sizes or None: exact
# sizes, False: none; whether mtimes are stated, file order)
CASES = {
    "nginx-exact.html": ("text/html", "http://127.0.0.1:18480/archive/", {}, True,
                         NGINX_ORDER, "html"),
    "nginx-inexact.html": ("text/html", "http://127.0.0.1:18480/inexact/", NGINX_INEXACT,
                           True, NGINX_ORDER, "html"),
    "nginx.json": ("application/json", "http://127.0.0.1:18480/json/", {}, True,
                   NGINX_ORDER, "nginx-json"),
    "nginx.xml": ("text/xml; charset=utf-8", "http://127.0.0.1:18480/xml/", {}, True,
                  NGINX_ORDER, "nginx-xml"),
    "apache-plain.html": ("text/html;charset=ISO-8859-1", "http://127.0.0.1:18483/archive/",
                          False, False, NGINX_ORDER, "html"),
    "apache-fancy.html": ("text/html;charset=UTF-8", "http://127.0.0.1:18483/fancy/", APACHE,
                          True, NGINX_ORDER, "html"),
    "apache-table.html": ("text/html;charset=UTF-8", "http://127.0.0.1:18483/table/", APACHE,
                          True, APACHE_TABLE_ORDER, "html"),
    "lighttpd.html": ("text/html;charset=utf-8", "http://127.0.0.1:18482/archive/", LIGHTTPD,
                      True, NGINX_ORDER, "html"),
    "caddy.html": ("text/html; charset=utf-8", "http://127.0.0.1:18484/archive/", {}, True,
                   NGINX_ORDER, "html"),
    "caddy.json": ("application/json", "http://127.0.0.1:18484/archive/", {}, True,
                   NGINX_ORDER, "caddy-json"),
    "python-http-server.html": ("text/html; charset=utf-8", "http://127.0.0.1:18481/archive/",
                                False, False, NGINX_ORDER, "html"),
}


@pytest.mark.parametrize("fixture", sorted(CASES))
def test_each_real_servers_page_is_read_exactly(fixture: str) -> None:
    content_type, base, rounded, dated, order, kind = CASES[fixture]
    listing = parse_listing((FIXTURES / fixture).read_bytes(), content_type, base)
    assert listing.format == kind and listing.url == base
    assert [f.name for f in listing.files] == order
    dirs = DIRS if fixture != "apache-table.html" else DIRS[::-1]
    assert [d.name for d in listing.dirs] == dirs
    for d in listing.dirs:
        assert d.url == base + quote(d.name, safe="") + "/"
        assert d.mtime == (DIR_MTIME if dated else None)
    for f in listing.files:
        assert f.url == base + quote(f.name, safe=""), f
        assert f.mtime == (MTIMES[f.name] if dated else None), f
        if rounded is False:
            assert (f.size, f.size_exact) == (None, False), f
        elif f.name in rounded:
            assert (f.size, f.size_exact) == (rounded[f.name], False), f
        else:
            assert (f.size, f.size_exact) == (SIZES[f.name], True), f
    # what was left out is the navigation: parents, sort orders, the server's home page
    assert all(s.reason in ("outside this directory", "query or fragment", "empty link",
                            "elsewhere (another scheme, host or port)")
               for s in listing.skipped), listing.skipped


def test_the_same_page_under_another_directory_url_gives_that_directorys_urls() -> None:
    body = (FIXTURES / "nginx-exact.html").read_bytes()
    listing = parse_listing(body, "text/html", "https://Example.org:443/deep/er/")
    assert listing.files[0].url == "https://Example.org:443/deep/er/100%25.bin"


PAGE = "<html><body><pre>{}</pre></body></html>"
BASE = "http://host:8080/pub/data/"


def links(*hrefs: str, base: str = BASE) -> tuple[list[str], list[str], dict[str, str]]:
    body = PAGE.format("\n".join(f'<a href="{h}">x</a>' for h in hrefs)).encode()
    listing = parse_listing(body, "text/html", base)
    return ([f.name for f in listing.files], [d.name for d in listing.dirs],
            {s.href: s.reason for s in listing.skipped})


@pytest.mark.parametrize(("href", "reason"), [
    ("../", "outside this directory"),
    ("..", "outside this directory"),
    ("./", "this directory itself"),
    (".", "this directory itself"),
    ("", "empty link"),
    ("/", "outside this directory"),
    ("/pub/", "outside this directory"),
    ("/pub/data/", "this directory itself"),
    ("/pub/other/x", "outside this directory"),
    ("/pub/data-x/y", "outside this directory"),
    ("sub/../../x", "outside this directory"),
    ("http://other:8080/pub/data/x", "elsewhere (another scheme, host or port)"),
    ("http://host:8081/pub/data/x", "elsewhere (another scheme, host or port)"),
    ("https://host:8080/pub/data/x", "elsewhere (another scheme, host or port)"),
    ("//evil.example/pub/data/x", "elsewhere (another scheme, host or port)"),
    ("http://user@host:8080/pub/data/x", "elsewhere (another scheme, host or port)"),
    ("http://host:99999/pub/data/x", "not a URL"),
    ("mailto:admin@host", "elsewhere (another scheme, host or port)"),
    ("javascript:alert(1)", "elsewhere (another scheme, host or port)"),
    ("data:text/plain,x", "elsewhere (another scheme, host or port)"),
    ("?C=N;O=D", "query or fragment"),
    ("?C=M&amp;O=A", "query or fragment"),
    ("a.txt?download=1", "query or fragment"),
    ("#top", "query or fragment"),
    ("a.txt#frag", "query or fragment"),
    ("sub/inner.txt", "more than one level down"),
    ("sub/x/", "more than one level down"),
    ("a%2Fb.txt", "not a single path segment"),
    ("%2e%2e/", "not a single path segment"),
    ("%2E", "not a single path segment"),
    ("nul%00.txt", "not a single path segment"),
    ("a\\..\\..\\x", "backslash in link"),
])
def test_each_safety_rule_skips_the_link_with_its_reason(href: str, reason: str) -> None:
    files, dirs, skipped = links(href, "kept.txt")
    assert files == ["kept.txt"] and dirs == []
    assert list(skipped.values()) == [reason]


def test_links_that_resolve_one_level_down_are_kept_however_spelled() -> None:
    files, dirs, skipped = links(
        "a%20b.txt", "./c.txt", "/pub/data/d.txt", "http://HOST:8080/pub/data/e.txt",
        "//host:8080/pub/data/f.txt", "/pub/%64ata/g.txt", "caf%c3%a9.txt", "c+d.txt",
        "a&amp;b.txt", "sub/", "./sub2/", " spaced.txt ", ".hidden", "a:b.txt")
    assert files == ["a b.txt", "c.txt", "d.txt", "e.txt", "f.txt", "g.txt", "café.txt",
                     "c+d.txt", "a&b.txt", " spaced.txt ".strip(), ".hidden"]
    assert dirs == ["sub", "sub2"]
    assert skipped == {"a:b.txt": "elsewhere (another scheme, host or port)"}


def test_default_ports_compare_equal_and_urls_are_rebuilt_from_the_name() -> None:
    body = PAGE.format('<a href="http://h:80/d/x%7e%41.txt">x</a>'
                       '<a href="caf%c3%a9.txt">y</a>').encode()
    listing = parse_listing(body, None, "http://h/d/")
    assert [(f.name, f.url) for f in listing.files] == [
        ("x~A.txt", "http://h/d/x~A.txt"), ("café.txt", "http://h/d/caf%C3%A9.txt")]


def test_a_name_not_in_utf8_round_trips_to_the_same_bytes_in_its_url() -> None:
    listing = parse_listing(PAGE.format('<a href="caf%E9.txt">x</a>').encode(), None,
                            "http://h/d/")
    assert listing.files[0].name == "caf\udce9.txt"
    assert listing.files[0].url == "http://h/d/caf%E9.txt"


def test_a_name_listed_twice_is_one_entry_and_file_and_dir_at_once_keeps_the_first() -> None:
    files, dirs, skipped = links("a.txt", "a.txt", "x/", "x")
    assert files == ["a.txt"] and dirs == ["x"]
    assert skipped == {"x": "listed as a file and a directory"}


def test_a_row_with_links_to_two_entries_gives_neither_the_rows_size() -> None:
    body = (b'<table><tr><td><a href="a">a</a></td><td><a href="b">b</a></td>'
            b'<td>12345</td><td>2025-01-01 00:00</td></tr>'
            b'<tr><td><a href="c"><img></a> <a href="c">c</a></td><td>12K</td>'
            b'<td>2025-01-01 00:01</td></tr></table>')
    listing = parse_listing(body, "text/html", "http://h/")
    assert [(f.name, f.size, f.size_exact, f.mtime) for f in listing.files] == [
        ("a", None, False, None), ("b", None, False, None), ("c", 12288, False, JAN_1 + 60)]


def test_a_name_that_looks_like_a_size_or_date_is_not_read_as_one() -> None:
    body = (b'<table><tr><td><a href="12K">12K</a></td><td>-</td><td>&nbsp;</td></tr>'
            b'</table><pre><a href="2025-01-01%2000:00%201">2025-01-01 00:00 1</a>\n'
            b'</pre>')
    listing = parse_listing(body, "text/html", "http://h/")
    assert [(f.name, f.size, f.mtime) for f in listing.files] == [
        ("12K", None, None), ("2025-01-01 00:00 1", None, None)]


def test_comments_scripts_and_styles_hold_no_links() -> None:
    body = (b'<!-- <a href="c.txt">c</a> --><script>var s = "<a href=\'s.txt\'>";'
            b' if (a < b) {}</script><style>a[href="t.txt"] {}</style>'
            b'<a href="real.txt">r</a><!-- unclosed <a href="u.txt">')
    listing = parse_listing(body, "text/html", "http://h/")
    assert [f.name for f in listing.files] == ["real.txt"]


def test_broken_markup_is_skipped_not_raised() -> None:
    for body in (b"<a href=", b"<a href='x.txt", b"<<<>>>", b"\xff\xfe<a href=y>", b"",
                 b"<a href=\"a.txt\"" + b" x" * 10000, b"<table><td><a href=z>"):
        parse_listing(body, "text/html", "http://h/")
    listing = parse_listing(b"<a href=bare.txt>b</a><A HREF='Upper.txt'>u</A>", None,
                            "http://h/")
    assert [f.name for f in listing.files] == ["bare.txt", "Upper.txt"]


def test_a_page_in_latin1_is_read_in_its_charset() -> None:
    body = '<a href="x.txt">café</a>'.encode("latin-1")
    assert parse_listing(body, "text/html; charset=iso-8859-1", "http://h/").files[0].name \
        == "x.txt"


@pytest.mark.parametrize("body", [
    b'[{ "name":"../x", "type":"file", "size":1 }, { "name":"a/b", "type":"file" },'
    b' { "name":"..", "type":"directory" }, { "name":"ok", "type":"file", "size":2 },'
    b' { "name":"dev", "type":"other" }, { "name":"nul\\u0000", "type":"file" }]',
])
def test_nginx_json_names_obey_the_same_rules(body: bytes) -> None:
    listing = parse_listing(body, "application/json", "http://h/d/")
    assert [(f.name, f.size, f.size_exact) for f in listing.files] == [("ok", 2, True)]
    assert len(listing.skipped) == 5 and listing.dirs == ()


def test_caddy_json_urls_obey_the_same_rules() -> None:
    body = (b'[{"name":"x","size":1,"url":"http://evil/x","is_dir":false},'
            b'{"name":"y","size":4096,"url":"./y/","is_dir":true},'
            b'{"name":"z","size":3,"url":"./z/","is_dir":false}]')
    listing = parse_listing(body, "application/json", "http://h/d/")
    assert listing.files == () and [d.name for d in listing.dirs] == ["y"]
    assert len(listing.skipped) == 2


def test_xml_with_entities_or_not_a_listing_is_refused() -> None:
    bomb = b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaa">]><list>&a;</list>'
    for body in (bomb, b"<?xml version='1.0'?><list><file>", b"<html/>"):
        with pytest.raises(ListingFormatError):
            parse_listing(body, "text/xml", "http://h/d/")
    for body in (b"{not json", b'{"a": 1}', b"[1, 2]"):
        with pytest.raises(ListingFormatError):
            parse_listing(body, "application/json", "http://h/d/")


@pytest.mark.parametrize("base", ["http://h/d", "http://h/d/?x=1", "ftp://h/d/", "h/d/",
                                  "http://h/d/#f"])
def test_a_base_url_that_is_not_a_directory_url_is_a_usage_error(base: str) -> None:
    with pytest.raises(ValueError):
        parse_listing(b"", "text/html", base)


def test_sizes_and_times() -> None:
    assert parse_size("12345") == (12345, True)
    assert parse_size(" 12K ") == (12288, False)
    assert parse_size("1.2K") == (1229, False)
    assert parse_size("3M") == (3 << 20, False)
    assert parse_size("12 KiB") == (12288, False)
    assert parse_size("123 bytes") == (123, True)
    assert parse_size("1.5") == (2, False)
    assert parse_size("-") is None and parse_size("") is None and parse_size("12X") is None
    assert parse_size("0") == (0, True) and parse_size("9" * 19) == (10**19 - 1, True)
    assert parse_size("1" * 20) is None  # past what a file can hold: no size, not a guess
    assert parse_time("01-Jan-2025 00:00") == JAN_1
    assert parse_time("2025-01-01 00:01") == JAN_1 + 60
    assert parse_time("2025-Jan-01 00:00:02") == JAN_1 + 2
    assert parse_time("31-Feb-2025 00:00") is None and parse_time("01-Foo-2025 00:00") is None
    assert parse_iso_time(" 2025-01-01T00:00:00Z") == JAN_1
    assert parse_iso_time("2025-01-01T01:00:00.123456789+01:00") == JAN_1
    assert parse_iso_time("yesterday") is None
