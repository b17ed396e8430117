"""The lister of a source that lists key ranges (an S3 bucket): many ranges at once, each one
page after another, split when they turn out long (ranges.py), with at most
`--list-concurrency` requests in flight. Pages come out in the order they are listed, each
with a token that lists it again; the coordinator journals them as the sequential lister's.

A source that hands out libcurl handles (S3: MultiRangeSource) is listed by one thread
driving a curl multi, which also reads the answers: 32 threads each waiting on a request
spent twice the CPU, most of it taking the GIL from each other. Any other source (and the
unit tests' fakes) is listed by request threads calling list_range. Either way the lister's
own thread owns every decision (which range next, where to split, what is sent); the
request side only lists.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bulkfetch.config import GetOptions, RetryPolicy
from bulkfetch.listing import carry, ranges
from bulkfetch.listing.lister import Listed, Lister, ListerThread, ListingFailed, ListingFinished
from bulkfetch.listing.multi_gets import Answer, MultiGets
from bulkfetch.listing.tree_lister import TreeLister, tree_concurrency
from bulkfetch.sources.abilities import KeyRange, MultiRangeSource, RangePage, RangeSource
from bulkfetch.sources.base import Source
from bulkfetch.sources.listed import ListedPage, ListingError

_Replay = tuple[int, str, str | None] | None  # a journaled page listed again: (seq, token, next)


@dataclass(slots=True)
class _Range:
    span: KeyRange
    carried: tuple[str, ...] = ()  # items carried in from this range's previous page
    first: bool = True  # its first page not listed yet: split it when it comes back long
    held: Listed | None = None  # listed, not sent: its last sample may go on (carry)
    attempt: int = 1


@dataclass(slots=True)
class _Done:
    work: _Range
    page: RangePage | None = None
    error: ListingError | None = None
    unexpected: BaseException | None = None
    replay: tuple[int, str, str | None] | None = None  # a journaled page listed again


@dataclass(slots=True)
class _State:
    seq: int
    open: list[_Range] = field(default_factory=list)  # ready for a request
    busy: int = 0  # requests in flight


class RangeLister(ListerThread):
    def __init__(self, source: RangeSource, policy: RetryPolicy,
                 replay: list[tuple[int, str | None, str | None]],
                 journaled: Sequence[tuple[str, str | None]], start_seq: int,
                 list_more: bool, ahead: int, concurrency: int,
                 key_of: Callable[[str], str] | None = None) -> None:
        super().__init__("bulkfetch-range-lister", ahead)
        self.source = source
        self.policy = policy
        self.replay = replay
        self.journaled = journaled  # (token, next token) of every journaled page
        self.start_seq = start_seq
        self.list_more = list_more
        self.concurrency = max(1, concurrency)
        self.key_of = key_of
        self.requests: queue.Queue[tuple[_Range, tuple[int, str, str | None] | None] | None] \
            = queue.Queue()
        self.answers: queue.Queue[_Done] = queue.Queue()
        self.threads: list[threading.Thread] = []
        self.gets: MultiGets[tuple[_Range, _Replay]] | None = None  # a MultiRangeSource's


    # -- request threads ---------------------------------------------------------------
    def _serve(self, source: RangeSource) -> None:
        while not self.stopping.is_set():
            try:
                request = self.requests.get(timeout=0.1)
            except queue.Empty:
                continue
            if request is None:
                return
            work, replay = request
            try:
                self.answers.put(_Done(work, page=source.list_range(work.span), replay=replay))
            except ListingError as exc:
                self.answers.put(_Done(work, error=exc, replay=replay))
            except Exception as exc:  # a bug or an unexpected answer: the lister says so
                self.answers.put(_Done(work, unexpected=exc, replay=replay))

    def _read(self, source: MultiRangeSource, key: tuple[_Range, _Replay], answer: Answer
              ) -> None:
        """On the multi's thread: an answer read as its range's page (or why not)."""
        work, replay = key
        if answer.error is not None:
            self.answers.put(_Done(work, error=source.transfer_error(*answer.error, answer.url),
                                   replay=replay))
            return
        try:
            page = source.range_page(work.span, answer.status, list(answer.headers),
                                     answer.body)
            self.answers.put(_Done(work, page=page, replay=replay))
        except ListingError as exc:
            self.answers.put(_Done(work, error=exc, replay=replay))
        except Exception as exc:  # a bug or an unexpected answer: the lister says so
            self.answers.put(_Done(work, unexpected=exc, replay=replay))

    def _ask(self, state: _State, work: _Range,
             replay: tuple[int, str, str | None] | None = None) -> None:
        state.busy += 1
        self._send(work, replay)

    def _send(self, work: _Range, replay: _Replay) -> None:
        if self.gets is not None:
            assert isinstance(self.source, MultiRangeSource)
            self.gets.ask((work, replay), self.source.range_url(work.span))
        else:
            self.requests.put((work, replay))

    # -- the lister's thread -----------------------------------------------------------
    def _ended(self) -> None:
        for _ in self.threads:
            self.requests.put(None)
        if self.gets is not None:
            self.gets.close()

    def _run(self) -> None:
        if isinstance(self.source, MultiRangeSource):
            source = self.source
            self.gets = MultiGets(source.list_handle, self.concurrency,
                                  lambda key, answer: self._read(source, key, answer),
                                  self.stopping, name="bulkfetch-list-multi")
            self.gets.start()
        else:
            for number in range(self.concurrency):
                source = self.source if number == 0 else self.source.clone()
                thread = threading.Thread(target=self._serve, args=(source,), daemon=True,
                                          name=f"bulkfetch-list-{number}")
                thread.start()
                self.threads.append(thread)
        state = _State(self.start_seq)
        # Journaled pages not done: listed again by their tokens, all at once.
        for seq, token, next_token in self.replay:
            assert token is not None
            range_token, carried = carry.decode(token)
            span, _ = ranges.parse(range_token)
            self._ask(state, _Range(span, carried, first=False), (seq, token, next_token))
        if self.list_more:
            covered = ranges.covered_by((carry.decode(t)[0], carry.decode(n)[0])
                                        for t, n in self.journaled)
            carried_at = self._carried_into_gaps()
            for span in ranges.gaps(covered):
                state.open.append(_Range(span, carried_at.get(span.after, ())))
        while not self.stopping.is_set():
            while state.open and state.busy < self.concurrency:
                self._ask(state, self._next_open(state))
            if state.busy == 0:  # every range listed to its end (and every replay sent)
                self._put(ListingFinished())
                return
            try:
                done = self.answers.get(timeout=0.1)
            except queue.Empty:
                continue
            state.busy -= 1
            if not self._take(state, done):
                return

    @staticmethod
    def _next_open(state: _State) -> _Range:
        """The next range to ask for. A range that goes on after a full page is joined
        with the open range that follows it, when that one is not asked for yet: key
        spaces cut at digits hold round numbers of keys, so the rest of a range is most
        often empty, and asking for it alone would double the requests."""
        work = state.open.pop()
        upto = work.span.upto
        if work.first or upto is None:
            return work
        for index, following in enumerate(state.open):
            if following.span.after == upto and not following.carried:
                del state.open[index]
                work.span = KeyRange(work.span.after, following.span.upto)
                work.first = following.first  # still split when it turns out long
                break
        return work

    def _carried_into_gaps(self) -> dict[str | None, tuple[str, ...]]:
        """Items a journaled page carried out into the next page of its range, by where
        that next page starts."""
        found: dict[str | None, tuple[str, ...]] = {}
        for _, next_token in self.journaled:
            range_token, carried = carry.decode(next_token)
            if carried and range_token is not None:
                span, ended = ranges.parse(range_token)
                if not ended:
                    found[span.after] = carried
        return found

    def _take(self, state: _State, done: _Done) -> bool:
        """Act on one answer; False when the listing ends here (failed or stopping)."""
        work = done.work
        if done.unexpected is not None:
            raise done.unexpected
        if done.error is not None:
            exc = done.error
            if self.first_contact_failed(exc):
                self._put(ListingFailed(str(exc), usage=True))
                return False
            if not exc.retryable or work.attempt > self.policy.retries:
                tries = f" after {work.attempt} attempts" if work.attempt > 1 else ""
                self._put(ListingFailed(f"{exc}{tries}", usage=exc.usage))
                return False
            delay = self.policy.delay(work.attempt, exc.retry_after_s, self.rng)
            work.attempt += 1
            timer = threading.Timer(delay, self._retry, args=(work, done.replay))
            timer.daemon = True
            state.busy += 1  # still out, on a timer
            timer.start()
            return True
        work.attempt = 1
        self.answered = True
        page = done.page
        assert page is not None
        if done.replay is not None:
            return self._send_replay(done.replay, page)
        return self._advance(state, work, page)

    def _retry(self, work: _Range, replay: tuple[int, str, str | None] | None) -> None:
        if not self.stopping.is_set():
            self._send(work, replay)

    def _send_replay(self, journaled: tuple[int, str, str | None], page: RangePage) -> bool:
        seq, token, next_token = journaled
        carried_in = carry.decode(token)[1]
        items = carried_in + page.items
        carried_out = len(carry.decode(next_token)[1])
        if carried_out:
            items = items[:len(items) - carried_out]
        # what the store says of each item goes with it while the items are the page's own
        whole = not carried_in and not carried_out
        return self._put(Listed(seq, token, ListedPage(
            items, next_token, sizes=page.sizes if whole else None,
            md5s=page.md5s if whole else None), replay=True))

    def _advance(self, state: _State, work: _Range, page: RangePage) -> bool:
        span = work.span
        if work.first and page.more:
            cuts = ranges.split_points(page.keys, span)
            bounds = [span.after, *cuts, span.upto]
            # this range keeps its start up to the first cut; the others start fresh
            span = KeyRange(span.after, bounds[1])
            for after, upto in itertools.pairwise(bounds[1:]):
                state.open.append(_Range(KeyRange(after, upto)))
        work.first = False
        more = page.more and (span.upto is None or page.keys[-1] < span.upto)
        token = carry.encode(ranges.token(span), work.carried)
        following = (KeyRange(page.keys[-1], span.upto) if more else span)
        next_range_token = ranges.token(following) if more else ranges.end_token(span)
        # what the store says of each item goes with it while the items are the page's own
        own = not work.carried and self.key_of is None
        listed = Listed(state.seq, token, ListedPage(
            work.carried + page.items, next_range_token,
            sizes=page.sizes if own else None, md5s=page.md5s if own else None,
            plain=page.plain and not work.carried))
        state.seq += 1
        work.span, work.carried = following, ()
        if self.key_of is not None:
            if not self._send_holding(work, listed, last=not more):
                return False
        elif not self._put(listed):
            return False
        if more:
            state.open.append(work)
        return True

    def _send_holding(self, work: _Range, listed: Listed, last: bool) -> bool:
        """Send the range's held page once this one shows where its last sample ends;
        hold this one (or send it too, when it ends the range: nothing goes on)."""
        assert self.key_of is not None
        if work.held is not None:
            held = work.held.page
            items = listed.page.items
            at = carry.cut(held.items, items[0] if items else None, self.key_of)
            moved = held.items[at:]
            out = Listed(work.held.seq, work.held.token,
                         ListedPage(held.items[:at], carry.encode(held.next_token, moved)))
            if not self._put(out):
                return False
            if moved:
                listed = Listed(listed.seq, carry.encode(carry.decode(listed.token)[0], moved),
                                ListedPage(moved + items, listed.page.next_token))
            work.held = None
        if last:
            return self._put(listed)
        work.held = listed
        return True


def lister_from_start(source: Source, options: GetOptions) -> Lister | RangeLister | TreeLister:
    """A lister of the whole source from its first page, with nothing journaled: key
    ranges at once for a source that lists by range (S3), directories at once for a tree,
    else page after page."""
    ahead = options.limits.max_pages_out
    ranged, tree = source.abilities().ranges, source.abilities().tree
    if tree is not None:
        return TreeLister(tree, options.retry, [], [], 0, True, ahead=ahead,
                          concurrency=tree_concurrency(options))
    if ranged is not None:
        return RangeLister(ranged, options.retry, [], [], 0, True, ahead=ahead,
                           concurrency=options.s3.list_concurrency)
    return Lister(source, options.retry, [], 0, None, list_more=True, ahead=ahead,
                  idle_s=options.timeouts.idle_s)
