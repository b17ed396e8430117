"""Pages that never end inside a sample: the lister carries a trailing sample over, and a
page listed again from its journaled tokens comes out exactly as it was sent."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from bulkfetch.config import RetryPolicy
from bulkfetch.listing import carry
from bulkfetch.listing.lister import Listed, Lister, ListingFinished
from bulkfetch.sources.abilities import Abilities
from bulkfetch.sources.listed import ListedPage
from bulkfetch.util.samples import split_key


class Names:
    """A listing of `names`, `size` a page; the token is the index of the page's first."""

    def __init__(self, names: list[str], size: int) -> None:
        self.names, self.size = names, size
        self.listed: list[str | None] = []

    def describe(self) -> str:
        return "names"

    def list_page(self, token: str | None) -> ListedPage:
        self.listed.append(token)
        start = int(token or 0)
        end = start + self.size
        return ListedPage(tuple(self.names[start:end]),
                          str(end) if end < len(self.names) else None)

    def resolve(self, item: str) -> tuple[str, str]:
        return item, "http://h/" + item

    def plain_urls(self, items: Sequence[str]) -> Iterable[str] | None:
        return None

    def abilities(self) -> Abilities:
        return Abilities()


def key(item: str) -> str:
    return split_key(item)[0]


def run(lister: Lister) -> list[Listed]:
    lister.run()
    events = []
    while not lister.out.empty():
        events.append(lister.out.get())
    assert isinstance(events[-1], ListingFinished), events[-1]
    return [e for e in events if isinstance(e, Listed)]


def lister(source: Names, **kwargs: object) -> Lister:
    args: dict[str, object] = {"replay": [], "start_seq": 0, "start_token": None,
                               "list_more": True, "ahead": 1000, "key_of": key}
    args.update(kwargs)
    return Lister(source, RetryPolicy(retries=0), **args)  # type: ignore[arg-type]


NAMES = [f"{i:03d}.{ext}" for i in range(40) for ext in ("jpg", "json", "txt")[: 1 + i % 3]]


def test_no_page_ends_inside_a_sample_and_nothing_is_lost_or_repeated() -> None:
    pages = run(lister(Names(NAMES, 7)))
    sent = [item for p in pages for item in p.page.items]
    assert sent == NAMES
    for before, after in itertools.pairwise(pages):
        assert key(before.page.items[-1]) != key(after.page.items[0])
    assert any(carry.decode(p.token)[1] for p in pages)  # some pages did carry


def test_a_page_listed_again_from_its_journaled_tokens_is_the_page_sent() -> None:
    source = Names(NAMES, 7)
    pages = run(lister(source))
    journal = [(p.seq, p.token, p.page.next_token) for p in pages]
    # resume: pages 2 and 5 not done, listing stopped after page 6
    again = run(lister(Names(NAMES, 7), replay=[journal[2], journal[5]], start_seq=7,
                       start_token=journal[6][2], before=(6, journal[6][1])))
    assert [p.page.items for p in again[:2]] == [pages[2].page.items, pages[5].page.items]
    assert [p.page.items for p in again[2:]] == [p.page.items for p in pages[7:]]
    assert [p.token for p in again[2:]] == [p.token for p in pages[7:]]


def test_a_page_journaled_without_a_carry_is_listed_again_as_it_was() -> None:
    # a run that journaled plain tokens (another sink, an older version) resumed with one
    plain = run(lister(Names(NAMES, 7), key_of=None))
    journal = [(p.seq, p.token, p.page.next_token) for p in plain]
    again = run(lister(Names(NAMES, 7), replay=journal[:3], list_more=False))
    assert [p.page.items for p in again] == [p.page.items for p in plain[:3]]


def test_a_page_that_is_one_sample_goes_out_whole() -> None:
    names = [f"a.{i}" for i in range(5)] + ["b.0", "c.0"]
    pages = run(lister(Names(names, 3)))
    # a sample bigger than a page is split (webdataset then sees two)
    assert [p.page.items for p in pages] == [("a.0", "a.1", "a.2"), ("a.3", "a.4", "b.0"),
                                             ("c.0",)]


def test_plain_names_are_never_carried() -> None:
    names = [f"f{i:04d}.bin" for i in range(50)]
    pages = run(lister(Names(names, 7)))
    assert [len(p.page.items) for p in pages] == [7] * 7 + [1]
    assert all(carry.decode(p.token)[1] == () for p in pages)


def test_cut() -> None:
    assert carry.cut(("a.1", "b.1", "b.2"), "b.3", key) == 1
    assert carry.cut(("a.1", "b.1"), "c.1", key) == 2  # the next page starts another
    assert carry.cut(("b.1", "b.2"), "b.3", key) == 2  # the whole page is one sample
    assert carry.cut(("a.1",), None, key) == 1
    assert carry.cut((), "x", key) == 0
    assert carry.encode("t", ()) == "t" and carry.decode("t") == ("t", ())
    assert carry.decode(carry.encode(None, ("x\0y", "\udcff"))) == (None, ("x\0y", "\udcff"))
