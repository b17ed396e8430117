"""The pages a worker has in hand, as a ledger: each file of a page ends stored or failed,
and a page whose last file ended goes to the sink (end_page), which gives back the reports
that are durable. Small bodies (fetcher.py) and big ones (big.py) end their files here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bulkfetch.models import Failure, Page, PageReport
from bulkfetch.sinks.base import Sink, Writer
from bulkfetch.sources.base import Source, data_url_body, unusable_name
from bulkfetch.util.names import check_name


@dataclass(slots=True, eq=False)  # compared and hashed by identity
class PageState:
    page: Page
    remaining: int
    write: Writer
    bytes: int = 0
    failures: list[Failure] = field(default_factory=list)
    # What the listing stated of the page's items (S3: Size and ETag), by item: (size, hex
    # MD5 or ""); None when it stated nothing. A body unlike it is another version.
    listed: dict[str, tuple[int, str]] | None = None
    # A cache's page (Page.headers): each item's extra request header lines (none: not in
    # it); None for every other page.
    headers: dict[str, list[str]] | None = None
    # Items redirected by hops the engine follows itself: name -> (the listed URL, hops so
    # far); a retry starts over from the listed URL. None until the first one.
    hops: dict[str, tuple[str, int]] | None = None

    @property
    def ok(self) -> int:
        """Files stored so far, derived from what is left: the per-file path updates one
        counter less."""
        return len(self.page.names) - self.remaining - len(self.failures)


# A transfer is a plain tuple (page state, name, url, attempt): building one per file must
# cost less than a Python-level __init__ call. A piece of a big file adds its Part, a layout
# probe its LayoutProbe (big.py).
Transfer = tuple[PageState, str, str, int]


class Pages:
    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.live: set[PageState] = set()
        self.finished: list[PageReport] = []  # durable page reports, not yet taken
        self.fetched = 0  # pages whose every file is stored or failed, not yet taken
        self.held = 0  # pages begun and not finished
        # Totals of finished pages; the pages in hand add theirs at tick time (not per file).
        self.files_ok = self.files_failed = self.bytes = 0

    def begin(self, page: Page, names: Sequence[str]) -> PageState:
        """Page `page` is in hand; its items are `names` (resolved, in listing order)."""
        state = PageState(page, len(page.names), self.sink.begin_page(page.seq, names))
        sizes, md5s = page.sizes, page.md5s
        if sizes is not None and len(sizes) == len(page.names) and (
                md5s is None or len(md5s) == len(sizes)):
            # by name, as the fetcher looks it up (an item may be "name NUL url")
            state.listed = dict(zip(names, zip(sizes, md5s or ("",) * len(sizes),
                                               strict=True), strict=True))
        self.held += 1
        self.live.add(state)
        return state

    def stored(self, state: PageState, size: int) -> None:
        """A file of `size` bytes of `state`'s page is in the sink."""
        state.bytes += size
        state.remaining -= 1
        if state.remaining == 0:
            self.finish(state)

    def failed(self, state: PageState, name: str, reason: str, attempts: int,
               url: str = "") -> None:
        """`name` of `state`'s page will not be stored: a Failure of the page."""
        state.failures.append(Failure(name, reason, attempts, url))
        self.sink.skip(state.page.seq, name)
        self.files_failed += 1
        state.remaining -= 1
        if state.remaining == 0:
            self.finish(state)

    def finish(self, state: PageState) -> None:
        """Every file of `state`'s page is stored or failed: the page goes to the sink."""
        self.live.discard(state)
        ok = state.ok
        self.files_ok += ok
        self.bytes += state.bytes
        self.held -= 1
        self.fetched += 1
        self.finished += self.sink.end_page(
            PageReport(state.page.seq, ok, state.bytes, tuple(state.failures)))

    def take_finished(self) -> list[PageReport]:
        finished, self.finished = self.finished, []
        return finished

    def take_fetched(self) -> int:
        fetched, self.fetched = self.fetched, 0
        return fetched

    def in_hand(self) -> tuple[int, int]:
        """(files stored, bytes) so far, the pages in hand included."""
        live = self.live
        return (self.files_ok + sum(state.ok for state in live),
                self.bytes + sum(state.bytes for state in live))


def resolve_items(source: Source, items: Sequence[str]) -> tuple[
        list[str], list[tuple[str, str]], list[tuple[str, str, str]],
        list[tuple[str, str, bytes]]]:
    """A page's items, one by one (a page whose items are not all plain names): (its names in
    listing order, (name, url) to fetch, (name, reason, url) refused before any request, the
    url "" when unknown, and (name, url, body) of data: URLs, stored as they are)."""
    names: list[str] = []
    ready: list[tuple[str, str]] = []
    refused: list[tuple[str, str, str]] = []
    inline: list[tuple[str, str, bytes]] = []  # (a table row's --save-cols JSON)
    resolve = source.resolve
    for item in items:
        url = ""
        try:
            name, url = resolve(item)
        except UnicodeError:  # e.g. a lone surrogate from \udcff in the JSON
            name, reason = item, "unsafe name: name is not valid UTF-8"
        except ValueError as exc:
            name, reason = unusable_name(item), str(exc)
        else:
            reason = check_name(name)
            if reason is None:
                names.append(name)
                if url.startswith("data:"):
                    try:
                        inline.append((name, url, data_url_body(url)))
                    except ValueError as exc:
                        refused.append((name, str(exc), url))
                else:
                    ready.append((name, url))
                continue
            reason = f"unsafe name: {reason}"
        names.append(name)
        refused.append((name, reason, url))
    return names, ready, refused, inline
