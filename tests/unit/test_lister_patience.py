"""The listing's patience (listing/lister.py): once a few pages have come, a list request is
given PATIENCE_FACTOR times the slowest recent page (PATIENCE_FLOOR_S at least) before it
is asked again; a page asked again gets the whole --idle-timeout."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from bulkfetch.config import RetryPolicy
from bulkfetch.listing import lister as lister_module
from bulkfetch.listing.lister import Lister
from bulkfetch.sources.abilities import Abilities
from bulkfetch.sources.listed import ListedPage, ListingError


class Paced:
    """Pages "0".."5" (each `seconds` long to answer); page "4" is silent once (its request
    ends with a retryable error, as a low-speed timeout does). Records the patience the
    lister set before each request."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.patience: list[float | None] = []
        self.current: float | None = None
        self.silent_once = True

    def describe(self) -> str:
        return "paced"

    def be_patient(self, seconds: float) -> None:
        self.current = seconds

    def list_page(self, token: str | None) -> ListedPage:
        self.patience.append(self.current)
        number = int(token or "0")
        if number == 4 and self.silent_once:
            self.silent_once = False
            raise ListingError("listing page 4: silent", retryable=True)
        time.sleep(self.seconds)
        return ListedPage((f"f{number}",), str(number + 1) if number < 5 else None)

    def resolve(self, item: str) -> tuple[str, str]:
        return item, f"http://h/{item}"

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        return None

    def abilities(self) -> Abilities:
        return Abilities(listing_patience=self.be_patient)


def run(source: Paced) -> None:
    lister = Lister(source, RetryPolicy(retries=3, backoff_base_s=0.001), [], 0, None,
                    list_more=True, ahead=10, idle_s=30.0)
    lister.run()


def test_patience_follows_the_pages_and_a_page_asked_again_gets_the_idle_timeout() -> None:
    source = Paced(0.3)  # 8 x 0.3 s: above the floor
    run(source)
    first, second, third, fourth, silent, again, last = source.patience
    assert first is second is third is None  # three pages' times first
    assert 8 * 0.3 <= fourth < 8 * 0.6  # (a loaded machine's sleep runs long, never short)
    # the silent page's first request: still the pages' pace (its slowest page so far, so
    # at least the fourth's), not --idle-timeout
    assert fourth <= silent < 8 * 0.6
    assert again == 30.0  # the silent page's second request: --idle-timeout
    assert 8 * 0.3 <= last < 8 * 0.6  # the next page: back to the pages' pace


def test_fast_pages_get_the_floor() -> None:
    source = Paced(0.0)
    run(source)
    assert source.patience[3] == lister_module.PATIENCE_FLOOR_S
