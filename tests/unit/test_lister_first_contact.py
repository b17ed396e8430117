"""The listing's first contact (listing/lister.py): until the source answers once in a run, a
failure no retry mends (nothing listens, no such host, not a listing) ends the run as the
user's mistake, at once; after that first answer the same failure is retried."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pycurl
import pytest

from bulkfetch.config import RetryPolicy
from bulkfetch.listing.lister import Listed, Lister, ListingFailed, ListingFinished
from bulkfetch.net.curl import unreachable
from bulkfetch.sources.abilities import Abilities
from bulkfetch.sources.listed import ListedPage, ListingError, listing_transfer_error

REFUSED = ListingError("listing http://127.0.0.1:9/list: nothing accepts connections",
                       retryable=True, unreachable=True)
NOT_A_LISTING = ListingError("listing http://h/list: expected JSON", retryable=False)


class Flaky:
    """Two pages; page `fails_on` raises `error` the first `times` times it is asked."""

    def __init__(self, error: ListingError, fails_on: str | None, times: int) -> None:
        self.error, self.fails_on, self.times = error, fails_on, times
        self.asked: list[str | None] = []

    def describe(self) -> str:
        return "flaky"

    def list_page(self, token: str | None) -> ListedPage:
        self.asked.append(token)
        if token == self.fails_on and self.times:
            self.times -= 1
            raise self.error
        return ListedPage(("a",), "2") if token is None else ListedPage(("b",), None)

    def resolve(self, item: str) -> tuple[str, str]:
        return item, f"http://h/{item}"

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        return None

    def abilities(self) -> Abilities:
        return Abilities()


def events(source: Flaky) -> list[object]:
    lister = Lister(source, RetryPolicy(retries=3, backoff_base_s=0.001), [], 0, None,
                    list_more=True, ahead=10)
    lister.run()
    found = []
    while not lister.out.empty():
        found.append(lister.out.get())
    return found


@pytest.mark.parametrize("error", [REFUSED, NOT_A_LISTING], ids=["unreachable", "final"])
def test_a_failure_before_the_first_answer_is_the_users_at_once(error: ListingError) -> None:
    source = Flaky(error, fails_on=None, times=99)
    found = events(source)
    assert source.asked == [None]  # no retry
    assert found == [ListingFailed(str(error), usage=True)]


def test_after_the_first_answer_an_unreachable_source_is_retried() -> None:
    source = Flaky(REFUSED, fails_on="2", times=2)
    found = events(source)
    assert source.asked == [None, "2", "2", "2"]  # two failures, then the page
    assert [type(event) for event in found] == [Listed, Listed, ListingFinished]


def test_after_the_first_answer_a_final_failure_is_not_the_users() -> None:
    found = events(Flaky(NOT_A_LISTING, fails_on="2", times=99))
    assert isinstance(found[-1], ListingFailed) and not found[-1].usage


@pytest.mark.parametrize(("code", "url", "says"), [
    (pycurl.E_COULDNT_CONNECT, "http://127.0.0.1:9/list", "nothing accepts connections at "
                                                          "127.0.0.1:9"),
    (pycurl.E_COULDNT_RESOLVE_HOST, "http://nowhere.invalid/list",
     "cannot resolve the host 'nowhere.invalid'"),
    (pycurl.E_OPERATION_TIMEDOUT, "http://10.0.0.1/list", "10.0.0.1:80 did not accept the "
                                                          "connection within --connect-timeout"),
    (pycurl.E_SSL_CONNECT_ERROR, "https://127.0.0.1:8000/list", "give http://"),
])
def test_failures_before_any_answer_name_host_port_and_what_to_check(
        code: int, url: str, says: str) -> None:
    message = "Connection timed out after 10001 milliseconds" \
        if code == pycurl.E_OPERATION_TIMEDOUT else "libcurl's words"
    error = listing_transfer_error(code, message, url, "listing", 1 << 20, None)
    assert error.unreachable and error.retryable
    assert says in str(error)


def test_a_transfer_that_stalls_after_connecting_is_not_unreachable() -> None:
    assert unreachable(pycurl.E_OPERATION_TIMEDOUT, "Operation timed out after 30000 "
                       "milliseconds with 0 bytes received", "http://h/list") is None
    assert unreachable(pycurl.E_SSL_CONNECT_ERROR, "reset", "http://h/list") is None
    assert not listing_transfer_error(pycurl.E_RECV_ERROR, "reset", "http://h/list", "listing",
                                      1 << 20, None).unreachable


def test_a_redirect_loop_is_final() -> None:
    error = listing_transfer_error(pycurl.E_TOO_MANY_REDIRECTS, "Maximum (5) redirects",
                                   "http://h/list", "listing", 1 << 20, None)
    assert not error.retryable and "redirects on and on" in str(error)
