"""Each pagination style's request URL and next token (sources/pagination.py), and Link
header parsing."""

from __future__ import annotations

import dataclasses

import pytest

from bulkfetch.config import ApiShape
from bulkfetch.errors import UsageError
from bulkfetch.sources.pagination import PageError, Paginator, link_next, with_param

LIST = "https://api.example/v1/files?kind=all"


def pages(**shape: object) -> Paginator:
    return Paginator(ApiShape(**shape), LIST)  # type: ignore[arg-type]


# -- Link headers ------------------------------------------------------------------------------
@pytest.mark.parametrize(("values", "target"), [
    (['<https://a/x?page=2>; rel="next", <https://a/x?page=9>; rel="last"'], "https://a/x?page=2"),
    (['<https://a/x?page=9>; rel="last", <https://a/x?page=2>; rel="next"'], "https://a/x?page=2"),
    (["<https://a/x?page=2>; rel=next"], "https://a/x?page=2"),
    (['<https://a/x?page=2>; REL="Next"'], "https://a/x?page=2"),
    (['<https://a/x?p=2>; rel="next last"'], "https://a/x?p=2"),
    (['<https://a/x?p=2>; title="a, b; c"; rel="next"'], "https://a/x?p=2"),
    (['<https://a/x?a=1,2>; rel="next"'], "https://a/x?a=1,2"),
    (['<https://a/1>; rel="prev"', '<https://a/3>; rel="next"'], "https://a/3"),
    (["</x?cursor=abc>; rel=\"next\""], "/x?cursor=abc"),
    (['<https://a/x?page=1>; rel="prev", <https://a/x?page=9>; rel="last"'], None),
    (['<https://a/x?page=1>; rel="nextish"'], None),
    ([""], None),
    ([], None),
])
def test_link_next_finds_the_next_relation(values: list[str], target: str | None) -> None:
    assert link_next(values) == target


def test_with_param_adds_to_the_query() -> None:
    assert with_param("https://a/x", "t", "a b&c") == "https://a/x?t=a%20b%26c"
    assert with_param("https://a/x?k=1", "t", "v") == "https://a/x?k=1&t=v"
    assert with_param("https://a/x?", "t", "v") == "https://a/x?t=v"


# -- token -------------------------------------------------------------------------------------
def test_token_style_sends_the_token_in_its_parameter() -> None:
    paginator = pages(paginate="token", next="nextPageToken", next_param="pageToken")
    assert paginator.request_url(None) == LIST
    assert paginator.request_url("T/2=") == LIST + "&pageToken=T%2F2%3D"
    assert paginator.next_token(None, LIST, "T2", [], 10, None) == "T2"
    assert paginator.next_token("T2", LIST, 17, [], 10, None) == "17"
    assert paginator.next_token("T2", LIST, None, [], 10, None) is None
    assert paginator.next_token("T2", LIST, "", [], 10, None) is None
    with pytest.raises(PageError, match="not a string"):
        paginator.next_token("T2", LIST, {"a": 1}, [], 10, None)


def test_token_style_needs_both_flags() -> None:
    with pytest.raises(UsageError, match="--next-param"):
        ApiShape(paginate="token", next="n")


# -- url / link --------------------------------------------------------------------------------
def test_url_style_journals_the_absolute_next_url_and_asks_for_it() -> None:
    paginator = pages(paginate="url", next="next")
    following = paginator.next_token(None, LIST, "/v1/files?page=2", [], 10, None)
    assert following == "https://api.example/v1/files?page=2"
    assert paginator.request_url(following) == following  # a rerun asks for that page
    assert paginator.next_token(following, following, None, [], 10, None) is None


def test_a_next_url_on_another_host_is_refused_unless_allowed() -> None:
    paginator = pages(paginate="url", next="next")
    for elsewhere in ("https://evil.example/v1/files?page=2", "http://api.example/v1/files",
                      "https://api.example:8443/v1/files", "file:///etc/passwd",
                      "ftp://api.example/x"):
        with pytest.raises(PageError):
            paginator.next_token(None, LIST, elsewhere, [], 10, None)
        with pytest.raises(PageError):  # nor can a journal hold one that is asked for
            paginator.request_url(elsewhere)
    allowed = pages(paginate="url", next="next", allow_cross_host_pages=True)
    assert allowed.next_token(None, LIST, "https://cdn.example/p2", [], 1, None) == \
        "https://cdn.example/p2"
    with pytest.raises(PageError):  # still http(s) only
        allowed.next_token(None, LIST, "file:///etc/passwd", [], 1, None)


def test_link_style_reads_the_header() -> None:
    paginator = pages(paginate="link")
    links = ['<https://api.example/v1/files?page=2>; rel="next"']
    assert paginator.next_token(None, LIST, None, links, 10, None) == \
        "https://api.example/v1/files?page=2"
    assert paginator.next_token(None, LIST, None, [], 10, None) is None


# -- offset / page -----------------------------------------------------------------------------
def test_offset_style_moves_by_the_items_listed_and_stops_on_a_short_page() -> None:
    paginator = pages(paginate="offset", page_param="offset", limit_param="limit", page_size=50)
    assert paginator.request_url(None) == LIST + "&offset=0&limit=50"
    assert paginator.next_token(None, LIST, None, [], 50, None) == "50"
    assert paginator.request_url("50") == LIST + "&offset=50&limit=50"
    assert paginator.next_token("50", LIST, None, [], 50, None) == "100"
    assert paginator.next_token("100", LIST, None, [], 49, None) is None
    assert paginator.next_token("100", LIST, None, [], 0, None) is None
    assert paginator.next_token("100", LIST, None, [], 50, 150) is None  # the total says so


def test_page_style_counts_up_from_the_first_page() -> None:
    paginator = pages(paginate="page", page_param="page")
    assert paginator.request_url(None) == LIST + "&page=1"
    assert paginator.next_token(None, LIST, None, [], 30, None) == "2"
    assert paginator.next_token("2", LIST, None, [], 30, None) == "3"
    assert paginator.next_token("3", LIST, None, [], 0, None) is None  # an empty page ends
    sized = pages(paginate="page", page_param="p", limit_param="per_page", page_size=30,
                  first_page=0)
    assert sized.request_url(None) == LIST + "&p=0&per_page=30"
    assert sized.next_token(None, LIST, None, [], 29, None) is None


def test_offset_needs_a_page_size_and_a_parameter() -> None:
    with pytest.raises(UsageError, match="--page-size"):
        ApiShape(paginate="offset", page_param="offset")
    with pytest.raises(UsageError, match="--page-param"):
        ApiShape(paginate="page")


def test_none_is_one_page() -> None:
    paginator = pages(paginate="none")
    assert paginator.request_url(None) == LIST
    assert paginator.next_token(None, LIST, "ignored", ['<https://x>; rel="next"'], 5,
                                None) is None


def test_a_refused_next_url_is_named_in_the_message() -> None:
    paginator = pages(paginate="link")
    assert paginator.request_url(None) == LIST  # the first page: the listing's own URL
    with pytest.raises(PageError, match=r"is on https://evil\.example:443, not the listing's"):
        paginator.request_url("https://evil.example/p2")
    long = "ftp://" + "x" * 300
    with pytest.raises(PageError) as caught:
        paginator.request_url(long)
    assert repr(long[:200]) in str(caught.value) and repr(long[:201]) not in str(caught.value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        paginator.list_url = "https://evil.example/"  # type: ignore[misc]
