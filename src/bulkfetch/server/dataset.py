"""What the reference server serves: a DataSet lists names page by page and looks names up.

The synthetic data set poses as any number of files without storing any: names, sizes and
bodies are pure functions of (seed, index), so anyone can verify a file on their own:

    H(i)        = blake2b(f"bulkfetch/{seed}/{i}".encode(), digest_size=16).digest()
    name(i)     = f"f{i:0{W}d}"  (W = max(10, digits of files-1));
                  nested: f"{H(i)[0] % 100:02d}/{H(i)[1] % 100:02d}/" + name(i)
    size(i)     = the --file-size spec drawn with unit = int.from_bytes(H(i)[8:16]) / 2**64
    body(i)     = concatenation over chunks k = 0, 1, ... of
                  shake_128(f"bulkfetch/{seed}/{i}/{k}".encode()).digest(<= 65536 bytes)
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from bulkfetch.server.sizes import SizeSpec

CHUNK = 65536
EPOCH_2025 = 1735689600  # Last-Modified of every synthetic file: 2025-01-01T00:00:00Z
SMALL_BODY = 1 << 20  # bodies up to this size are generated whole and hashed on the spot


class Entry(Protocol):
    """One servable file."""

    size: int
    last_modified: int

    def etag(self) -> str:
        """The quoted hex MD5 of the whole body."""
        ...

    def read(self, start: int, stop: int) -> Iterator[bytes]:
        """Bytes [start, stop) of the body, in chunks."""
        ...


class DataSet(Protocol):
    """Names in a stable order, served in pages addressed by opaque cursors."""

    identity: str  # what list tokens are bound to; equal identity means equal listing
    total: int | None  # names listed in all, when known up front
    page_size: int

    def page(self, cursor: bytes | None) -> tuple[list[str], bytes | None]:
        """Names of the page at `cursor` (None: the first) and the next cursor (None: last).
        Raises ValueError for a cursor this data set never issued."""
        ...

    def lookup(self, name: str) -> Entry | None: ...


@dataclass(slots=True)
class BytesEntry:
    body: bytes
    last_modified: int
    _etag: str = ""

    @property
    def size(self) -> int:
        return len(self.body)

    def etag(self) -> str:
        if not self._etag:
            self._etag = '"' + hashlib.md5(self.body).hexdigest() + '"'
        return self._etag

    def read(self, start: int, stop: int) -> Iterator[bytes]:
        yield self.body[start:stop]


class _EtagCache:
    """MD5s of large bodies are costly; keep the last few thousand."""

    def __init__(self, capacity: int = 4096) -> None:
        self._items: OrderedDict[object, str] = OrderedDict()
        self._capacity = capacity

    def get(self, key: object) -> str | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: object, value: str) -> None:
        self._items[key] = value
        if len(self._items) > self._capacity:
            self._items.popitem(last=False)


@dataclass(slots=True)
class SyntheticEntry:
    """A large synthetic body, generated chunk by chunk as it is read."""

    dataset: SyntheticDataSet
    index: int
    size: int
    last_modified: int = EPOCH_2025

    def etag(self) -> str:
        cached = self.dataset.etags.get(self.index)
        if cached is None:
            digest = hashlib.md5()
            for chunk in self.read(0, self.size):
                digest.update(chunk)
            cached = '"' + digest.hexdigest() + '"'
            self.dataset.etags.put(self.index, cached)
        return cached

    def read(self, start: int, stop: int) -> Iterator[bytes]:
        stop = min(stop, self.size)
        while start < stop:
            k, offset = divmod(start, CHUNK)
            chunk = self.dataset.chunk(self.index, k, min(CHUNK, self.size - k * CHUNK))
            piece = chunk[offset : offset + (stop - start)]
            yield piece
            start += len(piece)


class SyntheticDataSet:
    """`files` deterministic files, listed in index order, `page_size` names a page."""

    def __init__(
        self, files: int, page_size: int, seed: int, sizes: SizeSpec, nested: bool = False
    ) -> None:
        if files < 0 or page_size < 1:
            raise ValueError("files must be >= 0 and page_size >= 1")
        self.files = files
        self.page_size = page_size
        self.seed = seed
        self.sizes = sizes
        self.nested = nested
        self.width = max(10, len(str(max(files - 1, 0))))
        self.total: int | None = files
        self.identity = f"synthetic/{files}/{page_size}/{seed}/{int(nested)}"
        self.pages = max(1, -(-files // page_size))
        self.etags = _EtagCache()

    # -- the pure functions -------------------------------------------------------------
    def _hash(self, index: int) -> bytes:
        return hashlib.blake2b(f"bulkfetch/{self.seed}/{index}".encode(), digest_size=16).digest()

    def name(self, index: int) -> str:
        base = f"f{index:0{self.width}d}"
        if not self.nested:
            return base
        h = self._hash(index)
        return f"{h[0] % 100:02d}/{h[1] % 100:02d}/{base}"

    def size(self, index: int) -> int:
        if self.sizes.is_constant:
            return int(self.sizes.a)
        unit = int.from_bytes(self._hash(index)[8:16], "big") / 2**64
        return self.sizes.size(unit)

    def chunk(self, index: int, k: int, length: int) -> bytes:
        return hashlib.shake_128(f"bulkfetch/{self.seed}/{index}/{k}".encode()).digest(length)

    def body(self, index: int) -> bytes:
        return b"".join(SyntheticEntry(self, index, self.size(index)).read(0, self.size(index)))

    def index_of(self, name: str) -> int | None:
        """The index whose name is `name`, or None: the inverse of name()."""
        base = name.rpartition("/")[2] if self.nested else name
        digits = base[1:]
        if (
            len(base) != self.width + 1
            or base[0] != "f"
            or not digits.isascii()
            or not digits.isdigit()
        ):
            return None
        index = int(digits)
        if index >= self.files or (self.nested and self.name(index) != name):
            return None
        return index

    # -- DataSet -------------------------------------------------------------------------
    def page_number(self, cursor: bytes | None) -> int:
        if cursor is None:
            return 0
        if len(cursor) != 8:
            raise ValueError("cursor of a different data set")
        number = int.from_bytes(cursor, "big")
        if not 0 < number < self.pages:
            raise ValueError("page number out of range")
        return number

    def cursor(self, number: int) -> bytes:
        return number.to_bytes(8, "big")

    def names(self, number: int) -> list[str]:
        start = number * self.page_size
        return [self.name(i) for i in range(start, min(self.files, start + self.page_size))]

    def page(self, cursor: bytes | None) -> tuple[list[str], bytes | None]:
        number = self.page_number(cursor)
        following = self.cursor(number + 1) if number + 1 < self.pages else None
        return self.names(number), following

    def lookup(self, name: str) -> Entry | None:
        index = self.index_of(name)
        if index is None:
            return None
        size = self.size(index)
        if size <= SMALL_BODY:
            return BytesEntry(self.chunk_body(index, size), EPOCH_2025)
        return SyntheticEntry(self, index, size)

    def chunk_body(self, index: int, size: int) -> bytes:
        if size <= CHUNK:
            return self.chunk(index, 0, size)
        return b"".join(SyntheticEntry(self, index, size).read(0, size))
