"""What the reference server serves: a DataSet lists names page by page and looks names up.

The synthetic data set poses as any number of files without storing any: names, sizes and
bodies are pure functions of (seed, index), so anyone can verify a file on their own:

    H(i)        = blake2b(f"bulkfetch/{seed}/{i}".encode(), digest_size=16).digest()
    name(i)     = f"f{i:0{W}d}"  (W = max(10, digits of files-1));
                  nested: f"{H(i)[0] % 100:02d}/{H(i)[1] % 100:02d}/" + name(i)
    size(i)     = the --file-size spec drawn with unit = int.from_bytes(H(i)[8:16]) / 2**64
    body(i)     = concatenation over chunks k = 0, 1, ... of
                  shake_128(f"bulkfetch/{seed}/{i}/{k}".encode()).digest(<= 65536 bytes)

With --etag-salt S (not empty) every file changes, as if rewritten between two runs, while
names, sizes and list tokens stay the same:

    body(i)     = as above, over shake_128(f"bulkfetch/{seed}/{i}/{k}/{S}".encode())
    modified    = EPOCH_2025 + 1 + int.from_bytes(blake2b(f"bulkfetch/salt/{S}".encode(),
                      digest_size=8).digest(), "big") % (365 * 86400)

Without a salt every file's Last-Modified is EPOCH_2025 (2025-01-01T00:00:00Z); a salted
one is later, but two salts are in no particular order (ETag is the validator to trust).
The ETag of any file is the quoted hex MD5 of its body; --digest-header adds the SHA-256.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from bulkfetch.server.sizes import SizeSpec

CHUNK = 65536
EPOCH_2025 = 1735689600  # Last-Modified of every synthetic file: 2025-01-01T00:00:00Z
YEAR = 365 * 86400  # a salted Last-Modified falls within the year after EPOCH_2025
SMALL_BODY = 1 << 20  # bodies up to this size are generated whole and hashed on the spot


class Entry(Protocol):
    """One servable file."""

    size: int
    last_modified: int

    def etag(self) -> str:
        """The quoted hex MD5 of the whole body."""
        ...

    def sha256(self) -> bytes:
        """The SHA-256 of the whole body (raw), for Repr-Digest; with etag() in one pass when
        neither is known yet."""
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

    def sha256(self) -> bytes:
        return hashlib.sha256(self.body).digest()

    def read(self, start: int, stop: int) -> Iterator[bytes]:
        yield self.body[start:stop]


@dataclass(frozen=True, slots=True)
class Digests:
    etag: str  # quoted hex MD5
    sha256: bytes | None = None  # raw; None until someone asked for it


def hash_chunks(chunks: Iterator[bytes], sha256: bool) -> Digests:
    """One pass over a body: its MD5 (as an ETag) and, when asked, its SHA-256."""
    md5 = hashlib.md5()
    if not sha256:
        for chunk in chunks:
            md5.update(chunk)
        return Digests('"' + md5.hexdigest() + '"')
    sha = hashlib.sha256()
    for chunk in chunks:
        md5.update(chunk)
        sha.update(chunk)
    return Digests('"' + md5.hexdigest() + '"', sha.digest())


class DigestCache:
    """Digests of large bodies are costly: keep the last `capacity`, least recently used
    dropped first."""

    def __init__(self, capacity: int = 4096) -> None:
        self._items: OrderedDict[object, Digests] = OrderedDict()
        self._capacity = capacity

    def get(self, key: object) -> Digests | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: object, value: Digests) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def digests(self, key: object, chunks: Callable[[], Iterator[bytes]],
                sha256: bool) -> Digests:
        """The cached digests of `key`, computed from `chunks()` (in one pass) when missing
        or when the SHA-256 is asked for and not known yet."""
        known = self.get(key)
        if known is not None and (known.sha256 is not None or not sha256):
            return known
        computed = hash_chunks(chunks(), sha256)
        self.put(key, computed)
        return computed


@dataclass(slots=True)
class SyntheticEntry:
    """A large synthetic body, generated chunk by chunk as it is read."""

    dataset: SyntheticDataSet
    index: int
    size: int
    last_modified: int = EPOCH_2025

    def _body(self) -> Iterator[bytes]:
        return self.read(0, self.size)

    def etag(self) -> str:
        return self.dataset.etags.digests(self.index, self._body, sha256=False).etag

    def sha256(self) -> bytes:
        digest = self.dataset.etags.digests(self.index, self._body, sha256=True).sha256
        assert digest is not None
        return digest

    def read(self, start: int, stop: int) -> Iterator[bytes]:
        stop = min(stop, self.size)
        while start < stop:
            k, offset = divmod(start, CHUNK)
            chunk = self.dataset.chunk(self.index, k, min(CHUNK, self.size - k * CHUNK))
            piece = chunk[offset : offset + (stop - start)]
            yield piece
            start += len(piece)


def salted_modified(salt: str) -> int:
    """Last-Modified of every synthetic file under --etag-salt `salt` ('' : none)."""
    if not salt:
        return EPOCH_2025
    h = hashlib.blake2b(f"bulkfetch/salt/{salt}".encode(), digest_size=8).digest()
    return EPOCH_2025 + 1 + int.from_bytes(h, "big") % YEAR


class SyntheticDataSet:
    """`files` deterministic files, listed in index order, `page_size` names a page."""

    def __init__(
        self, files: int, page_size: int, seed: int, sizes: SizeSpec, nested: bool = False,
        salt: str = "",
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
        self.etags = DigestCache()
        # The salt changes bodies and Last-Modified only: the listing (and so the identity
        # list tokens are bound to) stays, so a client can resume a listing across salts.
        self.salt = salt
        self._chunk_tail = f"/{salt}" if salt else ""
        self.last_modified = salted_modified(salt)

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
        return hashlib.shake_128(
            f"bulkfetch/{self.seed}/{index}/{k}{self._chunk_tail}".encode()).digest(length)

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
            return BytesEntry(self.chunk_body(index, size), self.last_modified)
        return SyntheticEntry(self, index, size, self.last_modified)

    def chunk_body(self, index: int, size: int) -> bytes:
        if size <= CHUNK:
            return self.chunk(index, 0, size)
        return b"".join(SyntheticEntry(self, index, size).read(0, size))
