"""The lister: a thread of the main process that lists pages in order, retrying each one,
at most `ahead` pages ahead of the coordinator (a bounded queue)."""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from bulkfetch.config import RetryPolicy
from bulkfetch.listing import carry
from bulkfetch.sources.base import Source
from bulkfetch.sources.listed import ListedPage, ListingError


@dataclass(frozen=True, slots=True)
class Listed:
    seq: int
    token: str | None
    page: ListedPage
    replay: bool = False  # already journaled by an earlier run: listed again by its token


@dataclass(frozen=True, slots=True)
class ListingFinished:
    pass


@dataclass(frozen=True, slots=True)
class ListingFailed:
    message: str
    usage: bool = False  # the user must change something (exit status 2)


ListerEvent = Listed | ListingFinished | ListingFailed

# A list request silent for PATIENCE_FACTOR times the slowest of the last pages (at least
# PATIENCE_FLOOR_S) is given up and asked again: a server that leaves one request unanswered
# must not hold the listing for --idle-timeout. A page asked again gets the full timeout.
PATIENCE_FACTOR, PATIENCE_FLOOR_S, PATIENCE_PAGES = 8.0, 2.0, 16


def _cut(page: ListedPage, at: int, next_token: str | None) -> ListedPage:
    """`page`'s first `at` items, with their sizes and MD5s, under `next_token`."""
    return ListedPage(page.items[:at], next_token, page.total,
                      page.sizes[:at] if page.sizes is not None else None,
                      page.md5s[:at] if page.md5s is not None else None)


def _joined(first: ListedPage | tuple[str, ...], page: ListedPage, next_token: str | None,
            skip: int = 0) -> ListedPage:
    """`first`'s items from `skip` on (a page, or items carried in a token, whose sizes and
    MD5s are unknown), then `page`'s, under `next_token`: the listing's sizes and MD5s
    stay with their items (-1 and "" where unknown), so the fetcher checks every body it
    can against them."""
    if isinstance(first, tuple):
        first = ListedPage(first, None)
    head = first.items[skip:]
    if not head:
        if next_token == page.next_token:
            return page
        return ListedPage(page.items, next_token, page.total, page.sizes, page.md5s)
    if page.sizes is None and first.sizes is None:
        sizes = None
    else:
        sizes = (first.sizes[skip:] if first.sizes is not None else (-1,) * len(head)) + \
            (page.sizes if page.sizes is not None else (-1,) * len(page.items))
    if page.md5s is None and first.md5s is None:
        md5s = None
    else:
        md5s = (first.md5s[skip:] if first.md5s is not None else ("",) * len(head)) + \
            (page.md5s if page.md5s is not None else ("",) * len(page.items))
    return ListedPage(head + page.items, next_token, page.total, sizes, md5s)


class ListerThread(threading.Thread):
    """What both listers share: events out on a bounded queue, a stop flag, retry jitter."""

    def __init__(self, name: str, ahead: int) -> None:
        super().__init__(name=name, daemon=True)
        self.out: queue.Queue[ListerEvent] = queue.Queue(maxsize=max(1, ahead))
        self.stopping = threading.Event()
        self.rng = random.Random()
        # Until the source answers once in this run, a failure no retry mends (nothing
        # listens there, no such host, not a listing) is the user's to fix: the run stops
        # at once with exit status 2 and DEST as it was (runners/dest.py). After that
        # first answer, the same failure is a server's passing trouble, and is retried.
        self.answered = False

    def first_contact_failed(self, exc: ListingError) -> bool:
        """Whether `exc` ends the listing as the user's mistake (see `answered`)."""
        return not self.answered and (exc.unreachable or not exc.retryable)

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a bug or an unexpected answer: end the run with it
            self._put(ListingFailed(f"the listing stopped on an unexpected error: "
                                    f"{type(exc).__name__}: {exc}"))
        finally:
            self._ended()

    def _run(self) -> None:
        """The listing, sending its events with _put()."""
        raise NotImplementedError

    def _ended(self) -> None:
        """After _run, however it ended: let go of what it started."""

    def _put(self, event: ListerEvent) -> bool:
        """Hand `event` over; False once the lister is stopped while the queue is full."""
        while not self.stopping.is_set():
            try:
                self.out.put(event, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


class Lister(ListerThread):
    def __init__(self, source: Source, policy: RetryPolicy,
                 replay: list[tuple[int, str | None, str | None]],
                 start_seq: int, start_token: str | None, list_more: bool, ahead: int,
                 before: tuple[int, str | None] | None = None,
                 key_of: Callable[[str], str] | None = None, idle_s: float = 30.0) -> None:
        super().__init__("bulkfetch-lister", ahead)
        self.source = source
        # the source's word for how long a silent answer may last (None: it cannot say)
        self.be_patient = source.abilities().listing_patience
        self.idle_s = idle_s  # --idle-timeout: the patience of a page asked again
        self.took: deque[float] = deque(maxlen=PATIENCE_PAGES)  # the last pages' seconds
        self.policy = policy
        self.replay = replay
        self.start_seq = start_seq
        self.start_token = start_token
        self.list_more = list_more
        self.before = before  # (seq, token) of the page before start_seq, when resuming
        # An item's sample key: with it, a page never ends inside a sample (carry.py).
        self.key_of = key_of


    def _list(self, seq: int, token: str | None) -> ListedPage | None:
        """The source's page for a journaled token (its carried items not added)."""
        token = carry.decode(token)[0]
        attempt = 1
        while True:
            if self.be_patient is not None and len(self.took) >= 3:
                self.be_patient(max(PATIENCE_FLOOR_S, PATIENCE_FACTOR * max(self.took))
                                if attempt == 1 else self.idle_s)
            began = time.monotonic()
            try:
                page = self.source.list_page(token)
                self.took.append(time.monotonic() - began)
                self.answered = True
                return page
            except ListingError as exc:
                if self.first_contact_failed(exc):
                    self._put(ListingFailed(str(exc), usage=True))
                    return None
                if not exc.retryable or attempt > self.policy.retries:
                    tries = f" after {attempt} attempts" if attempt > 1 else ""
                    self._put(ListingFailed(f"page {seq}: {exc}{tries}", usage=exc.usage))
                    return None
                delay = self.policy.delay(attempt, exc.retry_after_s, self.rng)
                attempt += 1
                if self.stopping.wait(delay):
                    return None

    def _run(self) -> None:
        for seq, token, next_token in self.replay:
            page = self._list(seq, token)
            if page is None:
                return
            # as it was sent: with the items carried in, without those carried out
            carried_in = carry.decode(token)[1]
            carried_out = len(carry.decode(next_token)[1])
            page = _joined(carried_in, page, next_token)
            if carried_out:
                page = _cut(page, len(page.items) - carried_out, page.next_token)
            if not self._put(Listed(seq, token, page, replay=True)):
                return
        if not self.list_more:
            self._put(ListingFinished())
            return
        # The previous page's names, to catch a page repeated under a new token; kept whole
        # (one page), since comparing tuples stops at the first name that differs.
        seq, token = self.start_seq, self.start_token
        previous: tuple[str, ...] = ()
        if self.before is not None:
            # Resuming: list the last journaled page again, so that a next page repeating it
            # is caught as it was in the run that listed it.
            page = self._list(*self.before)
            if page is None:
                return
            previous = page.items
        held: Listed | None = None  # listed, not sent: its last sample may go on
        while not self.stopping.is_set():
            listed = self._list(seq, token)
            if listed is None:
                return
            if listed.items and listed.items == previous:  # an empty page is never a repeat
                self._put(ListingFailed(
                    f"page {seq} repeats page {seq - 1} under a new token: the server's "
                    "pagination is broken"))
                return
            previous = listed.items
            carried_in = carry.decode(token)[1]  # resuming after a page that carried
            page = _joined(carried_in, listed, listed.next_token)
            if held is not None and self.key_of is not None:
                last = held.page
                at = carry.cut(last.items, page.items[0] if page.items else None, self.key_of)
                token = carry.encode(last.next_token, last.items[at:])
                if not self._put(Listed(held.seq, held.token, _cut(last, at, token))):
                    return
                page = _joined(last, page, page.next_token, skip=at)
                held = None
            if self.key_of is not None and page.next_token is not None:
                held = Listed(seq, token, page)
            elif not self._put(Listed(seq, token, page)):
                return
            if page.next_token is None:
                self._put(ListingFinished())
                return
            seq, token = seq + 1, page.next_token
