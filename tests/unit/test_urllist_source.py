"""--from-file URLS.txt: names from URL paths, and two URLs naming one file (collisions)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bulkfetch.sources.base import unusable_name
from bulkfetch.sources.collisions import first_urls
from bulkfetch.sources.urllist import UrlListSource, _name, url_name


def pages(source: UrlListSource, token: str | None = None) -> list[tuple[str, ...]]:
    found = []
    while True:
        page = source.list_page(token)
        found.append(page.items)
        token = page.next_token
        if token is None:
            return found


def test_a_later_url_naming_an_earlier_file_is_refused_naming_both(tmp_path: Path) -> None:
    lines = ["http://a/img/1.jpg", "http://a/img/2.jpg", "# a comment", "http://b/img/1.jpg",
             "http://a/img/3.jpg", "http://a/img/1.jpg", "https://c:8443/img/2.jpg?x=1"]
    path = tmp_path / "urls.txt"
    path.write_text("\n".join(lines) + "\n")
    source = UrlListSource(str(path), lines_per_page=2)
    items = [item for page in pages(source) for item in page]
    refused = [item for item in items if "\0" in item]
    assert [unusable_name(item) for item in refused] == [lines[3], lines[6]]
    with pytest.raises(ValueError, match="name collision") as caught:
        source.resolve(refused[0])
    assert "http://a/img/1.jpg" in str(caught.value) and "'img/1.jpg'" in str(caught.value)
    # the same URL twice is no collision; the rest resolve as before
    assert source.resolve(items[-2]) == ("img/1.jpg", "http://a/img/1.jpg")
    # a run resumed from the middle of the list decides the same
    again = UrlListSource(str(path), lines_per_page=2)
    token = source.list_page(None).next_token
    assert [i for page in pages(again, token) for i in page] == items[2:]


def test_a_list_without_collisions_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "urls.txt"
    path.write_text("".join(f"http://h/f{i}\n" for i in range(5000)))
    source = UrlListSource(str(path))
    assert [len(page) for page in pages(source)] == [1000] * 5
    assert source.first_url == {}


def test_first_urls_finds_every_repeated_name_across_partitions() -> None:
    rows = [(f"n{i % 700}", f"http://h{i // 700}/n{i % 700}") for i in range(2100)]
    rows.append(("alone", "http://h/alone"))
    first = first_urls(lambda: iter(rows))
    assert len(first) == 700 and "alone" not in first
    assert first["n5"] == "http://h0/n5"


@pytest.mark.parametrize("url", [
    "http://a/b/c.jpg", "https://a:8/b//c", "http://a/b%20c", "http://a/b?x=1", "http://a",
    "http://a/", "HTTP://a/x", "http://a/ b", "http://a/\tb", "http://a/b#f",
    "http://[::1]/x/y", "https://u:p@h/x", "http://a/%2e%2e/x", "http://a\\b/c"])
def test_the_fast_name_is_the_name_resolve_gives(url: str) -> None:
    assert _name(url) == url_name(urlsplit(url).path)
