"""Key ranges (listing/ranges.py) and the range lister (listing/range_lister.py), over a small
in-memory sorted key space that answers like ListObjectsV2 (start-after, 1,000 keys)."""

from __future__ import annotations

import bisect
import threading
import uuid
from collections import Counter

import pytest

from bulkfetch.config import RetryPolicy
from bulkfetch.listing import carry, ranges
from bulkfetch.listing.lister import Listed, ListingFailed, ListingFinished
from bulkfetch.listing.range_lister import RangeLister
from bulkfetch.sources.abilities import KeyRange, RangePage
from bulkfetch.sources.listed import ListingError
from bulkfetch.util.samples import split_key

PAGE = 1000


class Keys:
    """A sorted key space; counts the requests and the keys each one returned."""

    def __init__(self, keys: list[str], fail_every: int = 0) -> None:
        self.keys = sorted(keys)
        self.lock = threading.Lock()
        self.requests = 0
        self.listed: Counter[str] = Counter()  # key -> times a request returned it
        self.fail_every = fail_every

    def clone(self) -> Keys:
        return self

    def list_range(self, span: KeyRange) -> RangePage:
        with self.lock:
            self.requests += 1
            if self.fail_every and self.requests % self.fail_every == 0:
                raise ListingError("HTTP 503 SlowDown", retryable=True, retry_after_s=0)
        start = 0 if span.after is None else bisect.bisect_right(self.keys, span.after)
        page = self.keys[start:start + PAGE]
        more = start + PAGE < len(self.keys)
        if span.upto is not None and page and page[-1] > span.upto:
            page = page[:bisect.bisect_right(page, span.upto)]
            more = False
        with self.lock:
            self.listed.update(page)
        return RangePage(tuple(page), tuple(page), more)


def drain(lister: RangeLister, stop_after: int | None = None) -> tuple[list[Listed], bool]:
    """The pages a lister sends (and whether it finished), stopping it after `stop_after`."""
    lister.start()
    pages: list[Listed] = []
    while True:
        event = lister.out.get(timeout=30)
        if isinstance(event, ListingFailed):
            raise AssertionError(event.message)
        if isinstance(event, ListingFinished):
            return pages, True
        pages.append(event)
        if stop_after is not None and len(pages) >= stop_after:
            lister.stop()
            return pages, False


def new_lister(source: Keys, journaled=(), replay=(), start_seq=0, list_more=True,
               key_of=None, concurrency=16) -> RangeLister:
    return RangeLister(source, RetryPolicy(backoff_base_s=0.001), list(replay),
                       list(journaled), start_seq, list_more, ahead=64,
                       concurrency=concurrency, key_of=key_of)


SHAPES = {
    "counter": [f"file-{i:06d}" for i in range(60_000)],
    "hex": [uuid.UUID(int=(i * 0x9E3779B97F4A7C15) % (1 << 128)).hex for i in range(30_000)],
    "nested": [f"{d}/{i:05d}.jpg" for d in ("a", "b/c", "zz") for i in range(12_000)],
    "short": ["x", "y", "z"],
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_key_once_in_parallel(shape: str) -> None:
    source = Keys(SHAPES[shape])
    pages, finished = drain(new_lister(source))
    assert finished
    listed = [item for page in pages for item in page.page.items]
    assert sorted(listed) == source.keys  # each exactly once
    assert [page.seq for page in pages] == list(range(len(pages)))
    assert len({page.token for page in pages}) == len(pages)  # journal tokens are unique
    if shape == "counter":  # split: far fewer sequential rounds than pages
        assert len(pages) >= 60 and source.requests < len(pages) * 2


def test_sequential_when_one_request_at_a_time_is_still_exact() -> None:
    source = Keys(SHAPES["counter"])
    pages, _ = drain(new_lister(source, concurrency=1))
    assert sorted(i for p in pages for i in p.page.items) == source.keys


def test_a_kill_then_a_rerun_lists_only_what_is_left() -> None:
    source = Keys(SHAPES["counter"])
    first, finished = drain(new_lister(source), stop_after=25)
    assert not finished
    journaled = [(page.token, page.page.next_token) for page in first]
    done = {item for page in first for item in page.page.items}
    source.listed.clear()
    second, finished = drain(new_lister(source, journaled=journaled, start_seq=len(first)))
    assert finished
    again = [item for page in second for item in page.page.items]
    assert sorted(done | set(again)) == source.keys
    assert not done & set(again)  # nothing journaled is sent again
    # no journaled range is listed again: only keys never journaled come back from the store
    assert not done & set(source.listed)


def test_journaled_pages_not_done_are_replayed_by_token() -> None:
    source = Keys(SHAPES["counter"])
    first, _ = drain(new_lister(source), stop_after=10)
    replay = [(p.seq, p.token, p.page.next_token) for p in first[:3]]
    again, finished = drain(new_lister(source, replay=replay, list_more=False))
    assert finished and all(p.replay for p in again)
    assert {p.seq: p.page.items for p in again} == {p.seq: p.page.items for p in first[:3]}


def test_samples_never_end_a_page_and_carry_survives_a_kill() -> None:
    keys = [f"s/{i:05d}.{ext}" for i in range(7_000) for ext in ("jpg", "json", "txt")]
    source = Keys(keys)
    key_of = lambda item: split_key(item)[0]  # noqa: E731
    first, _ = drain(new_lister(source, key_of=key_of), stop_after=8)
    journaled = [(page.token, page.page.next_token) for page in first]
    second, finished = drain(new_lister(source, journaled=journaled, start_seq=len(first),
                                        key_of=key_of))
    assert finished
    pages = first + second
    assert sorted(i for p in pages for i in p.page.items) == source.keys
    owner: dict[str, int] = {}
    for page in pages:
        for item in page.page.items:
            assert owner.setdefault(key_of(item), page.seq) == page.seq  # one page a sample
    assert any(carry.decode(p.token)[1] for p in pages)  # carries happened


def test_transient_errors_are_retried() -> None:
    source = Keys(SHAPES["counter"][:20_000], fail_every=4)
    pages, finished = drain(new_lister(source))
    assert finished and sorted(i for p in pages for i in p.page.items) == source.keys


def test_a_refusal_ends_the_listing() -> None:
    class Refusing(Keys):
        def list_range(self, span: KeyRange) -> RangePage:
            raise ListingError("HTTP 403 AccessDenied", retryable=False)

    lister = new_lister(Refusing([]))
    lister.start()
    event = lister.out.get(timeout=10)
    assert isinstance(event, ListingFailed) and "AccessDenied" in event.message


def test_gaps() -> None:
    K = KeyRange
    assert ranges.gaps([]) == [K(None, None)]
    assert ranges.gaps([K(None, "b"), K("c", "d"), K("d", None)]) == [K("b", "c")]
    assert ranges.gaps([K(None, "b"), K("b", None)]) == []
    assert ranges.gaps([K("a", "b")], K("a", "z")) == [K("b", "z")]
    assert ranges.gaps([K("c", "e"), K(None, "a")]) == [K("a", "c"), K("e", None)]


def test_tokens_round_trip_and_cover() -> None:
    span = KeyRange("a", None)
    assert ranges.parse(ranges.token(span)) == (span, False)
    assert ranges.parse(ranges.end_token(span)) == (span, True)
    covered = ranges.covered_by([(ranges.token(KeyRange(None, "m")),
                                  ranges.token(KeyRange("f", "m"))),
                                 (ranges.token(KeyRange("m", None)),
                                  ranges.end_token(KeyRange("m", None)))])
    assert covered == [KeyRange(None, "f"), KeyRange("m", None)]
    with pytest.raises(ValueError):
        ranges.parse("a server's token")


def test_split_points_follow_the_keys_shape() -> None:
    keys = [f"file-{i:06d}" for i in range(1000)]
    cuts = ranges.split_points(keys, KeyRange(None, None))
    assert cuts[:2] == ["file-001", "file-002"] and cuts[-1] == "file-9" and len(cuts) == 27
    # never past the range's end, never inside a name's extension
    assert all(c < "file-05" for c in ranges.split_points(keys, KeyRange(None, "file-05")))
    samples = [f"d/{i:04d}.jpg" for i in range(1000)]
    assert all("." not in cut for cut in ranges.split_points(samples, KeyRange(None, None)))
