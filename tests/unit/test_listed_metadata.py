"""What a listing states of each item (S3: Size and ETag) travels with its page and checks
the body: the listing's XML read both ways, pages that cross processes, the items a
coordinator keeps of a page, and the checks of a body against what was listed."""

from __future__ import annotations

import hashlib
import pickle

import pytest

from bulkfetch.config import S3Options, Timeouts
from bulkfetch.engine.parts import SplitPlan
from bulkfetch.engine.stated import unlike_listing
from bulkfetch.models import Page
from bulkfetch.server.faults import FaultConfig, FaultPlan
from bulkfetch.server.s3list import misstated
from bulkfetch.sources.abilities import LISTING, KeyRange, Pinned
from bulkfetch.sources.listed import ListedPage, listed_metadata
from bulkfetch.sources.s3 import S3Source, md5_of_etag

MD5_A = hashlib.md5(b"a").hexdigest()
MD5_B = hashlib.md5(b"b").hexdigest()


def listing(*contents: str, encoded: bool = True, count: bool = True) -> bytes:
    keys = "".join(contents)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        "<Name>b</Name><Prefix></Prefix>"
        + (f"<KeyCount>{len(contents)}</KeyCount>" if count else "")
        + "<MaxKeys>1000</MaxKeys>"
        + ("<EncodingType>url</EncodingType>" if encoded else "")
        + f"<IsTruncated>false</IsTruncated>{keys}</ListBucketResult>").encode()


def entry(key: str, size: int, etag: str) -> str:
    return (f"<Contents><Key>{key}</Key><LastModified>2025-01-01T00:00:00.000Z"
            f"</LastModified><ETag>{etag}</ETag><Size>{size}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>")


def source(prefix: str = "") -> S3Source:
    return S3Source(f"s3://bkt/{prefix}", S3Options(endpoint_url="http://127.0.0.1:9",
                                                  no_sign_request=True), Timeouts())


def test_etags_give_md5s_quoted_any_way_and_none_for_a_multipart_upload() -> None:
    assert md5_of_etag(f'"{MD5_A.upper()}"') == MD5_A
    assert md5_of_etag(f'"{MD5_A}-3"') == ""  # an object uploaded in 3 parts
    assert md5_of_etag("") == ""


@pytest.mark.parametrize("encoded", [True, False], ids=["pattern pass", "full XML parse"])
def test_a_listing_page_carries_each_items_size_and_md5(encoded: bool) -> None:
    # encoding-type=url takes the pattern pass; without it the full parse reads the page
    body = listing(entry("a", 1, f"&quot;{MD5_A}&quot;"),
                   entry("b", 1, f"&#34;{MD5_B.upper()}&#34;"),
                   entry("c", 50_000_000, f"&quot;{MD5_A}-7&quot;"), encoded=encoded)
    page = source().range_page(KeyRange(None, None), 200, [], body)
    assert page.items == ("a", "b", "c")
    assert page.sizes == (1, 1, 50_000_000)
    assert page.md5s == (MD5_A, MD5_B, "")
    assert page.plain is True  # plain keys, whichever way the page was read
    listed = source().range_page(KeyRange(None, "b"), 200, [], body)  # cut at a range's end
    assert (listed.items, listed.sizes, listed.md5s) == (("a", "b"), (1, 1), (MD5_A, MD5_B))


def test_a_listing_without_etags_says_no_md5s_and_keeps_the_sizes() -> None:
    body = listing("<Contents><Key>a</Key><Size>5</Size></Contents>",
                   "<Contents><Key>b</Key><Size>6</Size></Contents>")
    page = source().range_page(KeyRange(None, None), 200, [], body)
    assert (page.sizes, page.md5s) == ((5, 6), None)


def test_refused_and_filtered_keys_take_their_size_and_md5_with_them() -> None:
    body = listing(entry("p/", 0, f'"{MD5_A}"'), entry("p/a", 1, f'"{MD5_A}"'),
                   entry("p/a%20dir/", 0, f'"{MD5_B}"'), entry("p/b", 2, f'"{MD5_B}"'))
    page = source("p").range_page(KeyRange(None, None), 200, [], body)
    assert (page.items, page.sizes, page.md5s) == (("a", "b"), (1, 2), (MD5_A, MD5_B))


def test_a_page_crosses_processes_with_its_sizes_and_md5s() -> None:
    for page in (Page(3, "t", ("a", "b"), (1, 2), (MD5_A, "")),
                 Page(4, None, ("a",), (7,), ("",)),
                 Page(5, None, (), (), ()),
                 Page(6, "t", ("x\0y", "z"), (1, 2), (MD5_B, MD5_A)),
                 Page(7, "t", ("a",))):
        assert pickle.loads(pickle.dumps(page)) == page


def test_the_coordinator_keeps_each_items_size_and_md5_when_it_keeps_some_items() -> None:
    page = ListedPage(("a", "b", "c"), None, sizes=(1, 2, 3), md5s=(MD5_A, "", MD5_B))
    assert listed_metadata(page, page.items) == ((1, 2, 3), (MD5_A, "", MD5_B))
    assert listed_metadata(page, ("c", "a")) == ((3, 1), (MD5_B, MD5_A))
    assert listed_metadata(ListedPage(("a",), None), ("a",)) == (None, None)


def test_a_whole_answer_unlike_the_listing_is_an_object_that_changed() -> None:
    digest = hashlib.md5(b"a").hexdigest()
    assert unlike_listing((1, MD5_A), b"a", digest) is None
    assert unlike_listing((-1, ""), b"a", digest) is None  # nothing listed to check
    assert unlike_listing((1, MD5_B), b"a", None) is None  # --no-verify: no MD5 taken
    assert unlike_listing((2, MD5_A), b"a", digest) == \
        "changed since it was listed: body of 1 bytes, the listing gives 2"
    assert "MD5 is not the one the listing gives" in str(unlike_listing((1, MD5_B), b"a", digest))


def test_a_listed_md5_pins_a_big_file_and_a_listed_size_alone_keeps_the_servers_digests(
        ) -> None:
    response = {"crc32": b"\0\0\0\1"}
    by_md5 = Pinned(10, "md5", bytes.fromhex(MD5_A), LISTING)
    size_only = Pinned(10, "", b"", LISTING)
    assert by_md5.stated(response) == {"md5": bytes.fromhex(MD5_A)}
    assert size_only.stated(response) == response
    plan = SplitPlan(10, '"v"', response)
    assert plan.pin(size_only) is plan
    assert plan.pin(by_md5).stated == {"md5": bytes.fromhex(MD5_A)}
    assert by_md5.contradicts(10, {}) is None
    assert by_md5.contradicts(10, {"md5": bytes.fromhex(MD5_A)}) is None
    assert by_md5.contradicts(11, {}) == \
        "changed since it was listed: Content-Length 11, the listing gives 10"
    assert "another MD5 than the listing gives" in str(
        by_md5.contradicts(10, {"md5": bytes.fromhex(MD5_B)}))
    assert size_only.contradicts(10, {"md5": bytes.fromhex(MD5_B)}) is None
    assert size_only.mismatch(b"0123456789") is None
    assert size_only.mismatch(b"0") == "body of 1 bytes, the listing gives 10"


def test_the_servers_stale_listing_picks_names_by_seed_and_misstates_them() -> None:
    plan = FaultPlan(FaultConfig(stale_rate=0.25), seed=3)
    picked = [name for name in (f"f{i}" for i in range(2000)) if plan.stale(name)]
    assert 400 <= len(picked) <= 600
    assert picked == [n for n in (f"f{i}" for i in range(2000))
                      if FaultPlan(FaultConfig(stale_rate=0.25), seed=3).stale(n)]
    assert {plan.stale(name) for name in picked} == {"etag", "size"}
    assert FaultPlan(FaultConfig(), seed=3).stale("f1") is None
    etag = f'"{MD5_A}"'
    assert misstated(5, etag, None) == (5, etag)
    assert misstated(5, etag, "etag")[0] == 5 and misstated(5, etag, "etag")[1] != etag
    assert misstated(5, etag, "size")[0] == 6
