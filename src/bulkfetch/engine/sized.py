"""Bodies whose size the source gives (an S3 listing, a registry's descriptor): which start
as a stream at once, not as an in-memory attempt that libcurl stops at its headers for being
over --spool-above and that is then asked for again (a second request per file and, with
the rest of its body unread, its connection). Such a stream checks its headers against what
the source vouches for at its first chunk (spooling.SpooledBody)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bulkfetch.models import Page

if TYPE_CHECKING:
    from bulkfetch.engine.fetcher import Fetcher


def sized_streams(fetcher: Fetcher, state: Any, page: Page
                  ) -> Callable[[tuple[Any, ...]], bool] | None:
    """Whether a transfer of `page` (its fetcher's page state `state`) starts as a stream
    at once (BigFiles.sized), or None when none of them does. Only when its source vouches
    for a size above --spool-above and under --split-above (a bigger one is asked for whole
    first: its headers decide about ranges), and the body's check needs nothing of the
    headers an in-memory attempt would bring: a vouched digest, or no layout to ask (S3
    parts, layouts.py). A conditional page's requests stay as they are."""
    big = fetcher.big
    low = big.spool_above
    if not low or page.headers is not None:
        return None
    if fetcher.pinned is None and not (page.sizes and max(page.sizes) > low):
        return None
    high, pin_of = big.split_above, fetcher.pin_of
    asks_layout = big.layouts.request is not None

    def sized(transfer: tuple[Any, ...]) -> bool:
        pinned = pin_of(transfer)
        return (pinned is not None and low < pinned.size < high
                and (bool(pinned.algorithm) or not asks_layout))
    return sized
