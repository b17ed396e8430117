"""PageInOrder: a page's members reach the shard as whole samples, in listing order."""

from __future__ import annotations

from typing import Any

import pytest

from bulkfetch.sinks import ordered
from bulkfetch.sinks.ordered import Held, PageInOrder, sample_keys
from bulkfetch.util.samples import group, split_key


class Shard:
    """What one shard receives, in order, from any number of pages."""

    def __init__(self) -> None:
        self.members: list[str] = []

    def add(self, name: str, body: bytes, md5: str | None) -> None:
        self.members.append(name)

    def add_spooled(self, name: str, spool: Any, size: int, md5: str) -> None:
        assert not spool.discarded
        self.members.append(name)


class Spool:
    def __init__(self) -> None:
        self.discarded = False

    def discard(self) -> None:
        self.discarded = True


def page(shard: Shard, names: list[str], held: Held | None = None) -> PageInOrder:
    keys = [split_key(name)[0] for name in names]
    return PageInOrder(names, keys, shard.add, shard.add_spooled, held or Held())


def test_sample_keys_are_webdatasets_and_none_when_every_sample_is_alone() -> None:
    names = ["a/b/000001.seg.png", "a/b/000001.txt", "a/.hidden.x", "c", "d.e/f", "g.h/i.j"]
    assert sample_keys(names) == [split_key(name)[0] for name in names]
    assert sample_keys(["file-1.bin", "file-2.bin", "x/y.z"]) is None
    assert sample_keys([]) is None


def test_members_reach_the_shard_in_listing_order_whatever_order_they_end_in() -> None:
    shard = Shard()
    names = ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]
    order = page(shard, names)
    for name in ("c.jpg", "a.jpg", "d.jpg", "b.jpg"):
        order.write(name, b"x", None)
    order.finish()
    assert shard.members == names
    assert order.held.bytes == 0


def test_two_pages_writing_into_one_shard_never_split_a_sample() -> None:
    shard = Shard()
    first = page(shard, ["k1.jpg", "k1.json", "k1.txt", "k2.jpg"])
    second = page(shard, ["m1.jpg", "m1.txt", "m2.jpg", "m2.txt"])
    # interleaved completions of both pages
    first.write("k1.json", b"x", None)
    second.write("m1.txt", b"x", None)
    first.write("k1.jpg", b"x", None)
    second.write("m1.jpg", b"x", None)
    second.write("m2.jpg", b"x", None)
    first.write("k2.jpg", b"x", None)
    first.write("k1.txt", b"x", None)
    second.write("m2.txt", b"x", None)
    first.finish()
    second.finish()
    samples = [sorted(s) for s in group((name, b"x") for name in shard.members)]
    assert len(samples) == 4
    assert sorted(map(tuple, samples)) == sorted([
        ("__key__", "jpg", "json", "txt"), ("__key__", "jpg"), ("__key__", "jpg", "txt"),
        ("__key__", "jpg", "txt")])
    assert shard.members.index("k1.txt") == shard.members.index("k1.jpg") + 2


def test_a_failed_member_releases_the_rest_of_its_sample() -> None:
    shard = Shard()
    order = page(shard, ["a.jpg", "a.txt", "b.jpg"])
    order.write("a.txt", b"x", None)
    order.write("b.jpg", b"x", None)
    assert shard.members == []  # a.jpg is still on its way
    order.skip("a.jpg")
    assert shard.members == ["a.txt", "b.jpg"]


def test_under_memory_pressure_complete_samples_go_out_of_order_but_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ordered, "HELD_LIMIT", 10)
    shard = Shard()
    order = page(shard, ["a.jpg", "b.jpg", "b.txt", "c.jpg", "c.txt", "d.jpg"])
    order.write("b.jpg", b"12345678", None)
    order.write("c.jpg", b"12345678", None)  # 16 bytes held: b and c are not complete
    assert shard.members == []
    order.write("c.txt", b"1", None)  # c complete: written ahead of a and b
    assert shard.members == ["c.jpg", "c.txt"]
    order.write("b.txt", b"1", None)
    assert shard.members == ["c.jpg", "c.txt"]  # 9 bytes held: under the limit again
    order.write("a.jpg", b"1", None)
    order.write("d.jpg", b"1", None)
    order.finish()
    assert shard.members == ["c.jpg", "c.txt", "a.jpg", "b.jpg", "b.txt", "d.jpg"]
    assert order.held.bytes == 0


def test_spooled_bodies_wait_on_disk_and_their_spools_are_discarded_once_written() -> None:
    shard = Shard()
    order = page(shard, ["a.bin", "b.bin"])
    late, early = Spool(), Spool()
    order.write_spooled("b.bin", late, 100, "0" * 32)
    assert shard.members == [] and not late.discarded and order.held.bytes == 0
    order.write_spooled("a.bin", early, 100, "0" * 32)
    assert shard.members == ["a.bin", "b.bin"] and late.discarded and early.discarded


def test_an_abandoned_page_discards_the_spools_it_holds() -> None:
    shard = Shard()
    held = Held()
    order = page(shard, ["a.bin", "b.bin", "c.bin"], held)
    spool = Spool()
    order.write_spooled("c.bin", spool, 100, "0" * 32)
    order.write("b.bin", b"xyz", None)
    assert held.bytes == 3
    order.drop()
    assert spool.discarded and held.bytes == 0 and shard.members == []


def test_a_name_listed_twice_or_unknown_is_written_all_the_same() -> None:
    shard = Shard()
    order = page(shard, ["a.jpg", "b.jpg", "a.jpg"])
    order.write("b.jpg", b"x", None)
    order.write("a.jpg", b"x", None)
    order.write("a.jpg", b"x", None)
    order.write("zzz", b"x", None)
    order.finish()
    assert sorted(shard.members) == ["a.jpg", "a.jpg", "b.jpg", "zzz"]


def test_without_names_every_write_goes_straight_through() -> None:
    shard = Shard()
    order = page(shard, [])
    order.write("b", b"x", None)
    order.write("a", b"x", None)
    assert shard.members == ["b", "a"]


def test_too_many_spools_held_write_complete_samples_out_of_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ordered, "HELD_SPOOLS", 1)
    shard = Shard()
    held = Held()
    order = page(shard, ["a.bin", "b.bin", "c.bin"], held)
    spools = [Spool(), Spool()]
    order.write_spooled("b.bin", spools[0], 10, "0" * 32)
    assert shard.members == [] and held.spools == 1
    order.write_spooled("c.bin", spools[1], 10, "0" * 32)  # 2 open files: over the limit
    assert shard.members == ["b.bin", "c.bin"] and held.spools == 0
    assert all(spool.discarded for spool in spools)
    order.write("a.bin", b"x", None)
    order.finish()
    assert shard.members == ["b.bin", "c.bin", "a.bin"]
