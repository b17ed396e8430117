"""The synthetic data set: names, the inverse lookup, bodies, sizes and pages."""

from __future__ import annotations

import hashlib
import random
import time

import pytest

from bulkfetch.server.dataset import (
    CHUNK,
    EPOCH_2025,
    SMALL_BODY,
    BytesEntry,
    SyntheticDataSet,
    SyntheticEntry,
)
from bulkfetch.util.sizes import parse_size_spec

HUNDRED = parse_size_spec("100")


def make(files: int = 1000, page_size: int = 100, seed: int = 0, size: str = "100",
         nested: bool = False) -> SyntheticDataSet:
    return SyntheticDataSet(files, page_size, seed, parse_size_spec(size), nested)


# -- the documented formula, computed here without the module ----------------------------
def h(seed: int, i: int) -> bytes:
    return hashlib.blake2b(f"bulkfetch/{seed}/{i}".encode(), digest_size=16).digest()


def expected_name(seed: int, i: int, files: int, nested: bool) -> str:
    width = max(10, len(str(files - 1)))
    base = "f" + str(i).rjust(width, "0")
    if not nested:
        return base
    digest = h(seed, i)
    return f"{digest[0] % 100:02d}/{digest[1] % 100:02d}/{base}"


def expected_body(seed: int, i: int, size: int) -> bytes:
    parts, k = [], 0
    while sum(map(len, parts)) < size:
        want = min(65536, size - k * 65536)
        parts.append(hashlib.shake_128(f"bulkfetch/{seed}/{i}/{k}".encode()).digest(want))
        k += 1
    return b"".join(parts)


def entry_bytes(entry: object, start: int, stop: int) -> bytes:
    return b"".join(entry.read(start, stop))  # type: ignore[attr-defined]


# -- names -----------------------------------------------------------------------------
def test_names_follow_the_formula_and_are_distinct() -> None:
    data = make(files=5000, seed=3)
    names = [data.name(i) for i in range(5000)]
    assert names[0] == "f0000000000"
    assert names[4999] == "f0000004999"
    assert len(set(names)) == 5000
    assert names == [expected_name(3, i, 5000, False) for i in range(5000)]
    assert names == [make(files=5000, seed=3).name(i) for i in range(5000)]


def test_nested_names_follow_the_formula_are_distinct_and_depend_on_seed() -> None:
    data = make(files=3000, seed=9, nested=True)
    names = [data.name(i) for i in range(3000)]
    assert names == [expected_name(9, i, 3000, True) for i in range(3000)]
    assert len(set(names)) == 3000
    assert all(name.count("/") == 2 for name in names)
    assert len({name[:6] for name in names}) > 1000  # spread over many directories
    other = make(files=3000, seed=10, nested=True)
    assert sum(other.name(i) != names[i] for i in range(3000)) > 2900


def test_width_grows_past_ten_digits() -> None:
    assert make(files=10**10).name(0) == "f0000000000"
    wide = make(files=10**10 + 1)
    assert wide.name(0) == "f00000000000"
    assert wide.name(10**10) == "f10000000000"


@pytest.mark.parametrize("nested", [False, True])
def test_index_of_inverts_name(nested: bool) -> None:
    data = make(files=2000, seed=5, nested=nested)
    for i in [*range(50), *random.Random(0).sample(range(2000), 200), 1999]:
        assert data.index_of(data.name(i)) == i


@pytest.mark.parametrize(
    "name",
    [
        "",
        "f",
        "f000000001",  # one digit short
        "f00000000001",  # one digit long
        "g0000000001",
        "F0000000001",
        "f000000000\u0663",  # ARABIC-INDIC DIGIT THREE
        "f\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff11",  # full-width digits
        "f+000000001",
        "f-000000001",
        "f 000000001",
        "f00000_0001",
        "f0000001000",  # index == files
        "f9999999999",
        "/f0000000001",
        "x/f0000000001",
    ],
)
def test_index_of_rejects_near_misses_flat(name: str) -> None:
    assert make(files=1000).index_of(name) is None


def test_index_of_rejects_near_misses_nested() -> None:
    data = make(files=1000, seed=2, nested=True)
    good = data.name(17)
    prefix, _, base = good.rpartition("/")
    top, sub = prefix.split("/")
    wrong_top = f"{(int(top) + 1) % 100:02d}/{sub}/{base}"
    wrong_sub = f"{top}/{(int(sub) + 1) % 100:02d}/{base}"
    for name in (base, wrong_top, wrong_sub, "/" + good, good + "/", f"{top}/{base}",
                 f"x/{good}", f"{top}//{sub}/{base}", prefix + "/f000000001\u0667"):
        assert data.index_of(name) is None, name
    assert data.index_of(good) == 17
    assert data.lookup(wrong_top) is None


# -- sizes and bodies ------------------------------------------------------------------
def test_bodies_match_the_documented_formula() -> None:
    data = make(files=100, seed=11)
    for i in (0, 1, 42, 99):
        entry = data.lookup(data.name(i))
        assert entry is not None
        body = entry_bytes(entry, 0, entry.size)
        assert body == expected_body(11, i, 100)
        assert body == data.body(i)
        assert entry.etag() == '"' + hashlib.md5(body).hexdigest() + '"'
        assert entry.last_modified == EPOCH_2025
    assert data.body(1) != data.body(2)
    assert make(seed=12).body(1) != data.body(1)


def test_body_over_several_chunks_matches_the_formula() -> None:
    size = 3 * CHUNK + 123
    data = make(files=10, seed=4, size=str(size))
    assert data.body(6) == expected_body(4, 6, size)
    assert len(data.body(6)) == size


def test_sizes_come_from_the_spec_and_the_hash() -> None:
    spec = parse_size_spec("uniform:0:1000")
    data = SyntheticDataSet(3000, 100, 8, spec)
    for i in range(3000):
        unit = int.from_bytes(h(8, i)[8:16], "big") / 2**64
        assert data.size(i) == spec.size(unit)
    sizes = [data.size(i) for i in range(3000)]
    assert min(sizes) < 20 and max(sizes) > 980
    assert 450 < sum(sizes) / len(sizes) < 550
    entry = data.lookup(data.name(5))
    assert entry is not None and entry.size == sizes[5]
    assert len(data.body(5)) == sizes[5]


def test_lognormal_sizes_respect_max() -> None:
    data = make(files=2000, size="lognormal:1k:2:8k")
    sizes = [data.size(i) for i in range(2000)]
    assert max(sizes) == 8192
    assert 800 < sorted(sizes)[1000] < 1250


def test_small_and_large_entries() -> None:
    small = make(files=2, size=str(SMALL_BODY)).lookup("f0000000001")
    assert isinstance(small, BytesEntry) and small.size == SMALL_BODY
    large = make(files=2, size=str(SMALL_BODY + 1)).lookup("f0000000001")
    assert isinstance(large, SyntheticEntry) and large.size == SMALL_BODY + 1


def test_large_body_read_by_arbitrary_ranges_equals_the_slice() -> None:
    size = 3 * 1024 * 1024
    data = make(files=3, seed=21, size="3m")
    entry = data.lookup("f0000000002")
    assert isinstance(entry, SyntheticEntry)
    whole = entry_bytes(entry, 0, size)
    assert len(whole) == size
    assert whole == expected_body(21, 2, size)
    rng = random.Random(99)
    edges = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, size - CHUNK, size - 1, size]
    ranges = [(a, b) for a in edges for b in edges if a <= b]
    for _ in range(100):
        a = rng.randrange(size)
        ranges.append((a, min(size, a + rng.choice([1, 7, CHUNK, CHUNK + 3, 200_000]))))
    for start, stop in ranges:
        assert entry_bytes(entry, start, stop) == whole[start:stop], (start, stop)
    assert entry_bytes(entry, size - 5, size + 1000) == whole[-5:]  # stop past the end
    assert entry.etag() == '"' + hashlib.md5(whole).hexdigest() + '"'
    assert entry.etag() == data.lookup("f0000000002").etag()  # type: ignore[union-attr]


# -- pages -----------------------------------------------------------------------------
def walk(data: SyntheticDataSet) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        names, cursor = data.page(cursor)
        pages.append(names)
        if cursor is None:
            return pages


def test_pages_of_25000_files() -> None:
    data = make(files=25_000, page_size=1000)
    pages = walk(data)
    assert len(pages) == 25 == data.pages
    assert all(len(page) == 1000 for page in pages)
    assert [name for page in pages for name in page] == [data.name(i) for i in range(25_000)]


def test_last_page_is_shorter() -> None:
    data = make(files=2_500, page_size=1000)
    pages = walk(data)
    assert [len(page) for page in pages] == [1000, 1000, 500]
    assert pages[-1][-1] == "f0000002499"


def test_cursors_out_of_range_raise() -> None:
    data = make(files=25_000, page_size=1000)
    assert data.page(data.cursor(24))[1] is None
    for bad in (data.cursor(0), data.cursor(25), data.cursor(2**63), b"", b"\x00",
                b"\x00" * 9, (1).to_bytes(4, "big")):
        with pytest.raises(ValueError):
            data.page(bad)


def test_zero_files_give_one_empty_page() -> None:
    data = make(files=0)
    assert data.page(None) == ([], None)
    assert walk(data) == [[]]
    assert data.lookup("f0000000000") is None
    assert data.total == 0


def test_ten_billion_files_are_instant() -> None:
    started = time.perf_counter()
    data = make(files=10**10, page_size=1000)
    assert data.name(10**10 - 1) == "f9999999999"
    assert data.index_of("f9999999999") == 10**10 - 1
    assert data.index_of("f10000000000") is None
    assert data.pages == 10**7
    names, cursor = data.page(data.cursor(10**7 - 1))
    assert len(names) == 1000 and names[-1] == "f9999999999" and cursor is None
    assert data.page(data.cursor(5))[1] == data.cursor(6)
    assert time.perf_counter() - started < 1.0


def test_identity_distinguishes_listings() -> None:
    identities = {
        make(files=10).identity,
        make(files=11).identity,
        make(files=10, page_size=5).identity,
        make(files=10, seed=1).identity,
        make(files=10, nested=True).identity,
    }
    assert len(identities) == 5


def test_constructor_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        SyntheticDataSet(-1, 10, 0, HUNDRED)
    with pytest.raises(ValueError):
        SyntheticDataSet(10, 0, 0, HUNDRED)
