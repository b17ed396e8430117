"""FileServerSource's checks of a decoded list page (no network: `_validate` alone)."""

from __future__ import annotations

from typing import Any

import pytest

from bulkfetch.config import SourceShape, Timeouts
from bulkfetch.sources.fileserver import FileServerSource
from bulkfetch.sources.listed import ListedPage, ListingError

URL = "http://user:secret@127.0.0.1:8080/list?next-marker=abc"


def _validate(page: Any, headers: list[bytes] | None = None) -> ListedPage:
    source = FileServerSource("http://127.0.0.1:8080", SourceShape(), Timeouts())
    return source._validate(page, headers or [], URL)


def test_a_good_page_keeps_its_names_in_order_with_the_next_token_and_total() -> None:
    page = _validate({"FileNames": ["b", "a", "dir/c"], "NextMarker": "t2"},
                     [b"HTTP/1.1 200 OK\r\n", b"X-Total-Files: 1200\r\n"])
    assert page == ListedPage(("b", "a", "dir/c"), "t2", 1200)
    assert _validate({"FileNames": []}) == ListedPage((), None, None)


@pytest.mark.parametrize("entry", [None, 7, 1.5, True, ["x"], {"name": "x"}])
def test_a_non_string_entry_is_a_clear_permanent_error(entry: Any) -> None:
    with pytest.raises(ListingError) as caught:
        _validate({"FileNames": ["f1", entry, "f3"], "NextMarker": "t2"})
    assert not caught.value.retryable
    message = str(caught.value)
    assert "'FileNames' holds non-string entries" in message
    # The page is named without its credentials or query string.
    assert "listing http://127.0.0.1:8080/list?…" in message and "secret" not in message


@pytest.mark.parametrize("page, problem", [
    ({"Names": ["a"]}, "no 'FileNames' list"),
    ({"FileNames": "a"}, "no 'FileNames' list"),
    (["a"], "no 'FileNames' list"),
    ({"FileNames": ["a"], "NextMarker": ""}, "'NextMarker' is not a non-empty string"),
    ({"FileNames": ["a"], "NextMarker": 5}, "'NextMarker' is not a non-empty string"),
])
def test_a_page_of_the_wrong_shape_says_what_is_wrong(page: Any, problem: str) -> None:
    with pytest.raises(ListingError, match=problem) as caught:
        _validate(page)
    assert not caught.value.retryable
