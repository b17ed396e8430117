"""The lister: a thread of the main process that lists pages in order, retrying each one,
at most `ahead` pages ahead of the coordinator (a bounded queue)."""

from __future__ import annotations

import queue
import random
import threading
from dataclasses import dataclass

from bulkfetch.config import RetryPolicy
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


ListerEvent = Listed | ListingFinished | ListingFailed


class Lister(threading.Thread):
    def __init__(self, source: Source, policy: RetryPolicy, replay: list[tuple[int, str | None]],
                 start_seq: int, start_token: str | None, list_more: bool, ahead: int,
                 before: tuple[int, str | None] | None = None) -> None:
        super().__init__(name="bulkfetch-lister", daemon=True)
        self.source = source
        self.policy = policy
        self.replay = replay
        self.start_seq = start_seq
        self.start_token = start_token
        self.list_more = list_more
        self.before = before  # (seq, token) of the page before start_seq, when resuming
        self.out: queue.Queue[ListerEvent] = queue.Queue(maxsize=max(1, ahead))
        self.stopping = threading.Event()
        self.rng = random.Random()

    def stop(self) -> None:
        self.stopping.set()

    def _put(self, event: ListerEvent) -> bool:
        while not self.stopping.is_set():
            try:
                self.out.put(event, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _list(self, seq: int, token: str | None) -> ListedPage | None:
        attempt = 1
        while True:
            try:
                return self.source.list_page(token)
            except ListingError as exc:
                if not exc.retryable or attempt > self.policy.retries:
                    tries = f" after {attempt} attempts" if attempt > 1 else ""
                    self._put(ListingFailed(f"page {seq}: {exc}{tries}"))
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
        for seq, token in self.replay:
            page = self._list(seq, token)
            if page is None or not self._put(Listed(seq, token, page, replay=True)):
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
        while not self.stopping.is_set():
            page = self._list(seq, token)
            if page is None:
                return
            if page.items and page.items == previous:  # an empty page is never a repeat
                self._put(ListingFailed(
                    f"page {seq} repeats page {seq - 1} under a new token: the server's "
                    "pagination is broken"))
                return
            previous = page.items
            if not self._put(Listed(seq, token, page)):
                return
            if page.next_token is None:
                self._put(ListingFinished())
                return
            seq, token = seq + 1, page.next_token
