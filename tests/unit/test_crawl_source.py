"""sources/crawl.py on answers captured from real servers (tests/unit/fixtures/autoindex/):
a directory's answer read as its files, sizes, times and subdirectories under the run's
filters and depth; what each status means below and at the top; checksum files; the
items' names and URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkfetch.config import CrawlOptions, Timeouts
from bulkfetch.errors import UsageError
from bulkfetch.sources.crawl import IndexSource, directory_url
from bulkfetch.sources.listed import ListingError
from bulkfetch.sources.tree import REFUSED

FIXTURES = Path(__file__).parent / "fixtures" / "autoindex"
TOP = "http://127.0.0.1:18480/archive/"
NGINX = (FIXTURES / "nginx-exact.html").read_bytes()
HTML = [b"Content-Type: text/html\r\n"]


def source(**crawl: object) -> IndexSource:
    return IndexSource(TOP, CrawlOptions(**crawl), Timeouts(), 1 << 20)  # type: ignore[arg-type]


def page(src: IndexSource, path: str = "", status: int = 200, body: bytes = NGINX,
         headers: list[bytes] | None = None, url: str | None = None):  # type: ignore[no-untyped-def]
    return src.dir_page(path, status, HTML if headers is None else headers, body,
                        url or src.dir_url(path))


def test_a_directorys_files_come_with_exact_sizes_times_and_its_subdirectories() -> None:
    found = page(source(), "x/")
    at = dict(zip(found.files, found.sizes, strict=True))
    assert at["x/100%.bin"] == 12345 and at["x/日本.txt"] == 3145745 and at["x/c+d.txt"] == 0
    assert found.dirs == ("x/sub dir/", "x/ünï/")
    assert found.mtimes is not None and found.mtimes[found.files.index("x/100%.bin")] == \
        1735689600  # 01-Jan-2025 00:00 UTC
    assert found.estimated == 0 and found.sums == ()


def test_rounded_sizes_are_estimates_that_check_nothing() -> None:
    body = (FIXTURES / "nginx-inexact.html").read_bytes()
    found = page(source(), body=body)
    at = dict(zip(found.files, found.sizes, strict=True))
    # nginx's autoindex_exact_size off: '12K' rounded, a size under 1 KiB in bytes
    assert at["100%.bin"] == -1 and at["a b.txt"] == 5 and found.estimated == 3


def test_include_exclude_and_max_depth_choose_what_is_taken() -> None:
    found = page(source(include=("*.txt",), exclude=("*é*",)), "x/")
    assert "x/a b.txt" in found.files and "x/café.txt" not in found.files
    assert not any(item.endswith(".bin") for item in found.files)
    assert len(found.sizes) == len(found.files)
    assert page(source(max_depth=1), "x/").dirs == ()  # x/ is one level down already
    assert page(source(max_depth=1), "").dirs == ("sub dir/", "ünï/")
    assert page(source(max_depth=0), "").dirs == ()


@pytest.mark.parametrize(("status", "retryable"), [(404, False), (410, False), (403, False),
                                                    (401, False), (503, True), (429, True)])
def test_a_status_is_final_or_retried_and_the_users_mistake_only_at_the_top(
        status: int, retryable: bool) -> None:
    for path, usage in (("", not retryable), ("x/", False)):
        with pytest.raises(ListingError) as caught:
            page(source(), path, status=status)
        assert (caught.value.retryable, caught.value.usage) == (retryable, usage), (path, status)


def test_a_page_that_is_no_listing_or_moved_elsewhere_is_refused() -> None:
    with pytest.raises(ListingError, match="not a directory listing") as caught:
        page(source(), "", body=b'{"a": 1}', headers=[b"Content-Type: application/json\r\n"])
    assert caught.value.usage
    with pytest.raises(ListingError, match="redirected it to") as moved:
        page(source(), "x/", url="http://127.0.0.1:18480/elsewhere/")
    assert not moved.value.retryable and not moved.value.usage


def test_items_resolve_to_their_quoted_url_and_a_refused_directory_to_its_reason() -> None:
    src = source()
    assert src.resolve("sub dir/100%.bin") == ("sub dir/100%.bin",
                                               TOP + "sub%20dir/100%25.bin")
    assert src.dir_url("ünï/") == TOP + "%C3%BCn%C3%AF/"
    with pytest.raises(ValueError, match="HTTP 403"):
        src.resolve("gone/" + REFUSED + "listing …: HTTP 403")
    assert list(src.plain_urls(["a/b.txt", "c"]) or ()) == [TOP + "a/b.txt", TOP + "c"]
    assert src.plain_urls(["a b"]) is None


def test_checksum_files_are_found_and_read_for_their_own_directory() -> None:
    body = NGINX.replace(b'<a href="plain.dat">plain.dat</a>',
                         b'<a href="SHA256SUMS">SHA256SUMS</a>')
    src = source()
    assert page(src, "x/", body=body).sums == ("x/SHA256SUMS",)
    digest = "ab" * 32
    sums = (f"{digest}  ./a b.txt\n{digest.upper()} *c+d.txt\n# comment\nnot a line\n"
            f"\\{digest}  back\\\\slash\n").encode()
    assert src.read_sums("x/SHA256SUMS", 200, sums) == {
        "x/a b.txt": f"sha256:{digest}", "x/c+d.txt": f"sha256:{digest}",
        "x/back\\slash": f"sha256:{digest}"}
    assert src.read_sums("MD5SUMS", 200, f"{'0' * 32}  f\n".encode()) == {"f": "0" * 32}
    assert src.read_sums("x/SHA256SUMS", 404, sums) == {}


def test_a_files_sidecar_is_read_for_that_file_alone() -> None:
    body = NGINX.replace(b'<a href="plain.dat">plain.dat</a>',
                         b'<a href="plain.dat">plain.dat</a><a href="plain.dat.sha256">s</a>'
                         b'<a href="plain.dat.MD5">m</a><a href="gone.sha256">g</a>')
    src, digest = source(), "ab" * 32
    # a sidecar counts beside its file only (gone.sha256 names no file listed here)
    assert page(src, "x/", body=body).sums == ("x/plain.dat.sha256", "x/plain.dat.MD5")
    assert src.read_sums("x/plain.dat.sha256", 200, f"{digest}  plain.dat\n".encode()) == {
        "x/plain.dat": f"sha256:{digest}"}
    assert src.read_sums("x/plain.dat.sha256", 200, f"{digest.upper()}\n".encode()) == {
        "x/plain.dat": f"sha256:{digest}"}  # the hex alone, as some archives write it
    assert src.read_sums("x/plain.dat.MD5", 200, f"{'0' * 32} *x/plain.dat".encode()) == {
        "x/plain.dat": "0" * 32}
    for wrong in (f"{digest}  other.dat\n", f"{digest[:-2]}  plain.dat\n", "", "zz" * 32):
        assert src.read_sums("x/plain.dat.sha256", 200, wrong.encode()) == {}, wrong
    assert src.read_sums("x/plain.dat.sha256", 404, digest.encode()) == {}


def test_a_checksum_files_entry_climbing_out_is_dropped() -> None:
    digest = "ab" * 32
    sums = f"{digest}  ../y/z\n{digest}  sub/../../z\n{digest}  sub/deep\n".encode()
    assert source().read_sums("x/SHA256SUMS", 200, sums) == {"x/sub/deep": f"sha256:{digest}"}


@pytest.mark.parametrize("url", ["ftp://host/x/", "http:///x/", "http://h/x/?q=1",
                                 "http://h:99999/x/"])
def test_a_url_that_cannot_be_a_directory_listing_is_the_users_mistake(url: str) -> None:
    with pytest.raises(UsageError):
        directory_url(url)
    assert directory_url("http://h/x") == "http://h/x/"
