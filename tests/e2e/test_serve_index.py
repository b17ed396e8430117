"""`bulkfetch serve --shape index` and `--shape index-json` over loopback: the whole tree
walked with urllib and read with the parser a crawler uses (sources/autoindex.py), every
file's body checked against its ETag and the synthetic data set; the fault switches on the
listing pages too."""

from __future__ import annotations

import hashlib
import socket
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from bulkfetch.server.dataset import SyntheticDataSet
from bulkfetch.sources.autoindex import DirListing, parse_listing
from bulkfetch.testing import ReferenceServer
from bulkfetch.util.sizes import parse_size_spec

FILES = 500


def fetch(url: str, retry: bool = False) -> tuple[int, dict[str, str], bytes]:
    for _ in range(100):
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as error:
            if not (retry and error.code in (429, 500, 503)):
                return error.code, dict(error.headers), error.read()
        except OSError:  # a dropped connection (--reset-rate), a stall
            if not retry:
                raise
    raise AssertionError(f"{url}: no answer in 100 attempts")


def walk(top: str, retry: bool = False) -> tuple[list[DirListing], int]:
    """Every directory page under `top`, depth first in listing order; and the requests."""
    pages, pending, requests = [], [top], 0
    while pending:
        url = pending.pop()
        status, headers, body = fetch(url, retry)
        requests += 1
        assert status == 200, (url, body[:200])
        listing = parse_listing(body, headers.get("Content-Type"), url)
        pages.append(listing)
        pending += [d.url for d in reversed(listing.dirs)]
    return pages, requests


def check_everything(server: ReferenceServer, retry: bool = False) -> None:
    dataset = SyntheticDataSet(FILES, 1000, 0, parse_size_spec("uniform:0:3000"))
    pages, requests = walk(f"{server.url}/archive/", retry)
    assert requests == 1 + 10  # the top and its ten directories of 50
    files = [item for page in pages for item in page.files]
    assert [f.name for f in files] == [dataset.name(i) for i in range(FILES)]
    for index, item in enumerate(files):
        assert item.url.startswith(f"{server.url}/archive/d{index // 50:03d}/")
        status, headers, body = fetch(item.url, retry)
        assert status == 200
        assert headers["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
        assert body == dataset.body(index)
        assert (item.size, item.size_exact) == (len(body), True)


@pytest.mark.parametrize("shape", ["index", "index-json"])
def test_the_whole_tree_walked_and_every_file_checked(
        reference_server: Callable[..., ReferenceServer], shape: str) -> None:
    server = reference_server("--shape", shape, "--files", str(FILES),
                              "--file-size", "uniform:0:3000")
    assert f"{shape}: {server.url}/archive/" in server.banner
    check_everything(server)
    _, headers, _ = fetch(f"{server.url}/archive/")
    assert headers["Content-Type"] == ("text/html" if shape == "index" else "application/json")


def test_a_walk_through_failing_pages_and_files_gets_everything_in_the_end(
        reference_server: Callable[..., ReferenceServer]) -> None:
    server = reference_server("--shape", "index", "--files", str(FILES),
                              "--file-size", "uniform:0:3000", "--fail-rate", "0.3",
                              "--reset-rate", "0.05")
    check_everything(server, retry=True)


def test_fail_and_stall_hit_listing_pages(
        reference_server: Callable[..., ReferenceServer]) -> None:
    failing = reference_server("--shape", "index-json", "--files", "100", "--fail-rate", "1")
    assert fetch(f"{failing.url}/archive/")[0] in (500, 503)
    assert fetch(f"{failing.url}/archive/d001/")[0] in (500, 503)
    stalling = reference_server("--shape", "index", "--files", "100", "--stall-rate", "1")
    with pytest.raises((socket.timeout, TimeoutError, urllib.error.URLError)):
        urllib.request.urlopen(f"{stalling.url}/archive/", timeout=1)
