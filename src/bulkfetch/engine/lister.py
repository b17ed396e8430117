"""The lister: a thread of the main process that lists pages in order, retrying each one,
at most `ahead` pages ahead of the coordinator (a bounded queue)."""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from bulkfetch.config import RetryPolicy
from bulkfetch.engine import carry
from bulkfetch.sources.base import ListedPage, ListingError, Source


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


class ListerThread(threading.Thread):
    """What both listers share: events out on a bounded queue, a stop flag, retry jitter."""

    def __init__(self, name: str, ahead: int) -> None:
        super().__init__(name=name, daemon=True)
        self.out: queue.Queue[ListerEvent] = queue.Queue(maxsize=max(1, ahead))
        self.stopping = threading.Event()
        self.rng = random.Random()

    def stop(self) -> None:
        self.stopping.set()

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
                 key_of: Callable[[str], str] | None = None) -> None:
        super().__init__("bulkfetch-lister", ahead)
        self.source = source
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
            try:
                return self.source.list_page(token)
            except ListingError as exc:
                if not exc.retryable or attempt > self.policy.retries:
                    tries = f" after {attempt} attempts" if attempt > 1 else ""
                    self._put(ListingFailed(f"page {seq}: {exc}{tries}", usage=exc.usage))
                    return None
                delay = self.policy.delay(attempt, exc.retry_after_s, self.rng)
                attempt += 1
                if self.stopping.wait(delay):
                    return None

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a bug or an unexpected answer: end the run with it
            self._put(ListingFailed(f"the listing stopped on an unexpected error: "
                                    f"{type(exc).__name__}: {exc}"))

    def _run(self) -> None:
        for seq, token, next_token in self.replay:
            page = self._list(seq, token)
            if page is None:
                return
            # as it was sent: with the items carried in, without those carried out
            items = carry.decode(token)[1] + page.items
            carried_out = len(carry.decode(next_token)[1])
            if carried_out:
                items = items[:len(items) - carried_out]
            page = ListedPage(items, next_token, page.total)
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
            page = ListedPage(carried_in + listed.items, listed.next_token, listed.total)
            if held is not None and self.key_of is not None:
                last = held.page
                at = carry.cut(last.items, page.items[0] if page.items else None, self.key_of)
                token = carry.encode(last.next_token, last.items[at:])
                if not self._put(Listed(held.seq, held.token,
                                        ListedPage(last.items[:at], token, last.total))):
                    return
                page = ListedPage(last.items[at:] + page.items, page.next_token, page.total)
                held = None
            if self.key_of is not None and page.next_token is not None:
                held = Listed(seq, token, page)
            elif not self._put(Listed(seq, token, page)):
                return
            if page.next_token is None:
                self._put(ListingFinished())
                return
            seq, token = seq + 1, page.next_token
