"""One page's members into its tar shard as whole samples, in listing order.

webdataset makes a sample of consecutive members with the same key (samples.split_key), so
every member of a sample must sit next to the others. Transfers end in any order and the
pages of one shard write into it side by side: a page writes a sample only once each of its
members is stored or failed, all together, and samples in the page's listing order. A
body that ends before an earlier sample is complete waits in memory; when the shard's
waiting bodies pass HELD_LIMIT (a retried file holds back the rest of its page), complete
samples go out of order. A sample is never split: listing order is what gives way.

A page whose every member is a sample of its own (plain names: `file-000123.bin`) needs no
order to stay whole, and keeping one costs 2.6 µs a file, a tenth of the tar sink's CPU
(benchmarks/get.py, 29.1 against 26.5 µs): such a page writes straight into the shard, in
the order its transfers end. sample_keys() tells the two apart for 0.3 µs a name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

HELD_LIMIT = 16 << 20  # bytes of bodies one sink's pages hold back, at most (see above)
HELD_SPOOLS = 64  # spooled bodies held back, at most: each keeps a file open

_SKIPPED: Any = object()  # a position that failed: nothing to write
_WRITTEN: Any = object()  # a position written out of order, under memory pressure
# a position's entry: (name, body, md5, spool, size); body is None for a spooled one
Entry = tuple[str, bytes | None, str | None, Any, int]


def sample_keys(names: Sequence[str]) -> list[str] | None:
    """The sample key of each name (samples.split_key inlined: 0.29 against 0.56 µs a
    name), or None when no two neighbours share one: every sample has one member."""
    keys = [name[:dot] if (dot := name.find(".", name.rfind("/") + 2)) >= 0 else name
            for name in names]
    if any(map(str.__eq__, keys, keys[1:])):
        return keys
    return None


class Held:
    """The bytes held back by all the pages of one sink (shared, so one budget)."""

    __slots__ = ("bytes", "spools")

    def __init__(self) -> None:
        self.bytes = 0
        self.spools = 0

    @property
    def over(self) -> bool:
        return self.bytes > HELD_LIMIT or self.spools > HELD_SPOOLS


class PageInOrder:
    def __init__(self, names: Sequence[str], keys: list[str],
                 add: Callable[[str, bytes, str | None], None],
                 add_spooled: Callable[[str, Any, int, str], None], held: Held) -> None:
        self.names = names
        self.keys = keys  # sample_keys(names)
        self.position = dict(zip(names, range(len(names)), strict=True))
        self.add = add
        self.add_spooled = add_spooled
        self.held = held
        self.waiting: dict[int, Any] = {}  # position -> Entry, _SKIPPED or _WRITTEN
        self.next = 0  # the first position not yet written or skipped

    def _end(self, start: int) -> int:
        """The position after the sample that starts at `start`."""
        keys, end = self.keys, start + 1
        key = keys[start]
        while end < len(keys) and keys[end] == key:
            end += 1
        return end

    def write(self, name: str, body: bytes, md5: str | None) -> None:
        at = self.position.get(name)
        if at is None or at in self.waiting or at < self.next:
            self.add(name, body, md5)  # a name listed twice: no place to keep it in
            return
        if at == self.next and self._end(at) == at + 1:  # the usual case: next, and alone
            self.add(name, body, md5)
            self.next += 1
            if self.waiting:
                self._advance()
            return
        self.waiting[at] = (name, body, md5, None, 0)
        self.held.bytes += len(body)
        self._advance()

    def write_spooled(self, name: str, spool: Any, size: int, md5: str) -> None:
        at = self.position.get(name)
        if at is None or at in self.waiting or at < self.next:
            self._put((name, None, md5, spool, size))
            return
        self.waiting[at] = (name, None, md5, spool, size)  # on disk: no memory held
        self.held.spools += 1
        self._advance()

    def skip(self, name: str) -> None:
        at = self.position.get(name)
        if at is not None and at >= self.next and at not in self.waiting:
            self.waiting[at] = _SKIPPED
            self._advance()

    def _release(self, entry: Entry) -> None:
        if entry[1] is not None:
            self.held.bytes -= len(entry[1])
        else:
            self.held.spools -= 1

    def _put(self, entry: Entry) -> None:
        name, body, md5, spool, size = entry
        if body is not None:
            self.add(name, body, md5)
            return
        try:
            self.add_spooled(name, spool, size, md5)
        finally:
            spool.discard()

    def _advance(self) -> None:
        """Write the samples now complete at the front; under memory pressure, any."""
        waiting, count = self.waiting, len(self.keys)
        while self.next < count:
            end = self._end(self.next)
            if any(at not in waiting for at in range(self.next, end)):
                break
            self._write_sample(range(self.next, end))
            self.next = end
        if self.held.over:
            self._write_complete_samples()

    def _write_sample(self, positions: range) -> None:
        waiting = self.waiting
        for at in positions:
            entry = waiting.pop(at)
            if entry is _SKIPPED or entry is _WRITTEN:
                continue
            self._release(entry)
            self._put(entry)

    def _write_complete_samples(self) -> None:
        """Out of order: every sample whose members are all in hand (memory pressure)."""
        waiting = self.waiting
        for start in sorted(waiting):
            if start < self.next or waiting.get(start) is _WRITTEN:
                continue
            if start > 0 and self.keys[start - 1] == self.keys[start]:
                continue  # not a sample's first member
            end = self._end(start)
            if all(at in waiting for at in range(start, end)):
                self._write_sample(range(start, end))
                for at in range(start, end):
                    waiting[at] = _WRITTEN

    def finish(self) -> None:
        """The page ended: every name is written or failed. Write what waits, in order (a
        name listed twice leaves its first position empty)."""
        for at in sorted(self.waiting):
            entry = self.waiting.pop(at)
            if entry is _SKIPPED or entry is _WRITTEN:
                continue
            self._release(entry)
            self._put(entry)
        self.next = len(self.keys)

    def drop(self) -> None:
        """The page is abandoned (a stop): release what waits."""
        for entry in self.waiting.values():
            if entry is _SKIPPED or entry is _WRITTEN:
                continue
            self._release(entry)
            if entry[1] is None:
                entry[3].discard()
        self.waiting.clear()
