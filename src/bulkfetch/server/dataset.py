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

With --epoch N --mutate-rate P a share of the files change from one epoch to the next, as a
bucket does between two runs of a sync. Epoch 1 is the data set above, unchanged. In each
epoch e = 2..N every file changes independently with probability P, decided by (seed, i, e)
alone, 16 epochs a hash:

    M(i, b)       = blake2b(f"bulkfetch/{seed}/{i}/mutate/{b}".encode(), digest_size=64)
    changed(i, e) = int.from_bytes(M(i, e // 16)[4 * (e % 16) : 4 * (e % 16) + 4], "big")
                        < int(P * 2**32)
    version(i)    = the largest e in 2..N with changed(i, e), else 1

A version-v file (v > 1) has the body of the formula above over
shake_128(f"bulkfetch/{seed}/{i}.{v}/{k}{T}") (T: "/S" with a salt, else ""): a third
segment no version-1 text has, so no (salt, version) pair repeats another's bytes. Its ETag
is the MD5 of that body and its Last-Modified is (v - 1) days after version 1's (EPOCH_2025,
or the salted time), so If-Modified-Since sees the change too. Names, sizes, the listing and
its tokens stay the same in every epoch (a changed file keeps its size), and so do the
answers of epoch N for every file that did not change since: versions only grow with N, and
the files changed after epoch a up to epoch b are those whose version at b is above a
(mutated_indices()). Growing --files adds names after the others and leaves those as they
were (name, size, body and versions depend on the index alone), until the name width grows
past 10 digits. The --hostile-names extras are not synthetic files and never change.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from bulkfetch.util.sizes import SizeSpec

CHUNK = 65536
EPOCH_2025 = 1735689600  # Last-Modified of every synthetic file: 2025-01-01T00:00:00Z
YEAR = 365 * 86400  # a salted Last-Modified falls within the year after EPOCH_2025
SMALL_BODY = 1 << 20  # bodies up to this size are generated whole and hashed on the spot
DAY = 86400  # a version-v file's Last-Modified is v - 1 days after version 1's
# --epoch's upper bound: a file unchanged since epoch 1 costs N / 16 hashes a request (about
# 80 us at N = 1,000, for a tiny rate), which benchmarks of the server must not be
# dominated by; a file that changed in the last 16 epochs costs one hash.
MAX_EPOCH = 1000
_EPOCHS_A_HASH = 16  # 64 bytes of blake2b: a 32-bit draw for each of 16 epochs
_DRAWS = struct.Struct(f">{_EPOCHS_A_HASH}I")


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


class SyntheticNames(Sequence[str]):
    """A synthetic data set's names by index, in listing order, without storing any: any
    --files works."""

    def __init__(self, dataset: SyntheticDataSet) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return self.dataset.files

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        if isinstance(index, slice):
            return [self.dataset.name(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.dataset.name(index)


def every_name(dataset: DataSet) -> list[str]:
    """Every name `dataset` lists, in its listing order (paged through once)."""
    names: list[str] = []
    cursor: bytes | None = None
    while True:
        page, cursor = dataset.page(cursor)
        names.extend(page)
        if cursor is None:
            return names


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
    version: int = 1  # --epoch/--mutate-rate: the epoch this body was last changed in

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
            length = min(CHUNK, self.size - k * CHUNK)
            # version 1 calls chunk() as it always was: code that wraps it keeps working
            chunk = (self.dataset.chunk(self.index, k, length) if self.version == 1
                     else self.dataset.chunk(self.index, k, length, self.version))
            piece = chunk[offset : offset + (stop - start)]
            yield piece
            start += len(piece)


def salted_modified(salt: str) -> int:
    """Last-Modified of every synthetic file under --etag-salt `salt` ('' : none)."""
    if not salt:
        return EPOCH_2025
    h = hashlib.blake2b(f"bulkfetch/salt/{salt}".encode(), digest_size=8).digest()
    return EPOCH_2025 + 1 + int.from_bytes(h, "big") % YEAR


def mutate_limit(rate: float) -> int:
    """The 32-bit draws below which a file changes in an epoch, for --mutate-rate `rate`."""
    if not 0.0 <= rate <= 1.0:  # also refuses NaN
        raise ValueError(f"mutate rate must be within [0, 1], got {rate}")
    return int(rate * 2**32)


def file_version(seed: int, index: int, limit: int, epoch: int) -> int:
    """The epoch (2..`epoch`) file `index` last changed in, else 1; `limit`: mutate_limit().
    Searched from `epoch` down, a hash per 16 epochs, so a file that changed lately costs
    one hash whatever N is."""
    if limit <= 0 or epoch < 2:
        return 1
    for block in range(epoch // _EPOCHS_A_HASH, -1, -1):
        draws = _DRAWS.unpack(hashlib.blake2b(
            f"bulkfetch/{seed}/{index}/mutate/{block}".encode(), digest_size=64).digest())
        first = block * _EPOCHS_A_HASH
        low = max(first, 2) - first  # epochs 0 and 1 never change
        high = min(epoch - first, _EPOCHS_A_HASH - 1)
        if min(draws[low : high + 1]) >= limit:  # the usual case: no change in this block
            continue
        for at in range(high, low - 1, -1):
            if draws[at] < limit:
                return first + at
    return 1


def mutated_indices(seed: int, files: int, rate: float, epoch_from: int,
                    epoch_to: int) -> Iterator[int]:
    """The indices (ascending) of the files among the first `files` whose body and ETag at
    `epoch_to` differ from those at `epoch_from` (<= epoch_to): changed in an epoch after
    epoch_from up to epoch_to. What `get --sync` from epoch_from to epoch_to must fetch
    again, besides the files a larger --files adds. One pass, nothing kept: any `files`."""
    if not 1 <= epoch_from <= epoch_to:
        raise ValueError(f"need 1 <= epoch_from <= epoch_to, got {epoch_from}, {epoch_to}")
    limit = mutate_limit(rate)
    for index in range(files):
        if file_version(seed, index, limit, epoch_to) > epoch_from:
            yield index


class SyntheticDataSet:
    """`files` deterministic files, listed in index order, `page_size` names a page; at
    `epoch` with `mutate_rate` P, changed since epoch 1 as the module's docstring says."""

    def __init__(
        self, files: int, page_size: int, seed: int, sizes: SizeSpec, nested: bool = False,
        salt: str = "", epoch: int = 1, mutate_rate: float = 0.0,
    ) -> None:
        if files < 0 or page_size < 1:
            raise ValueError("files must be >= 0 and page_size >= 1")
        if not 1 <= epoch <= MAX_EPOCH:
            raise ValueError(f"epoch must be 1..{MAX_EPOCH}, got {epoch}")
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
        self.last_modified = salted_modified(salt)  # of version 1, i.e. of unchanged files
        # Epochs, like the salt, leave the listing and its identity alone: a client may
        # resume a listing across them, and a sync lists the same names.
        self.epoch = epoch
        self.mutate_rate = mutate_rate
        self._mutate_limit = mutate_limit(mutate_rate)
        # False: every file is version 1 and lookups skip the version hash entirely
        self.mutating = epoch > 1 and self._mutate_limit > 0

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

    def version(self, index: int) -> int:
        """The epoch file `index` last changed in (1: never), at this data set's epoch."""
        if not self.mutating:
            return 1
        return file_version(self.seed, index, self._mutate_limit, self.epoch)

    def modified(self, version: int) -> int:
        """Last-Modified of a file of `version`: later for each later version."""
        return self.last_modified + (version - 1) * DAY

    def changed_since(self, epoch: int) -> Iterator[int]:
        """The indices whose body and ETag here differ from those at `epoch` (<= this one)."""
        return mutated_indices(self.seed, self.files, self.mutate_rate, epoch, self.epoch)

    def chunk(self, index: int, k: int, length: int, version: int = 1) -> bytes:
        # Version 1 keeps the original text, so epoch 1 is byte for byte the data set of old
        key = index if version == 1 else f"{index}.{version}"
        return hashlib.shake_128(
            f"bulkfetch/{self.seed}/{key}/{k}{self._chunk_tail}".encode()).digest(length)

    def body(self, index: int) -> bytes:
        """The body of file `index` as served at this data set's epoch."""
        size = self.size(index)
        return b"".join(SyntheticEntry(self, index, size, version=self.version(index))
                        .read(0, size))

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
        if not self.mutating:
            if size <= SMALL_BODY:
                return BytesEntry(self.chunk_body(index, size), self.last_modified)
            return SyntheticEntry(self, index, size, self.last_modified)
        version = self.version(index)
        modified = self.modified(version)
        if size <= SMALL_BODY:
            return BytesEntry(self.chunk_body(index, size, version), modified)
        return SyntheticEntry(self, index, size, modified, version)

    def chunk_body(self, index: int, size: int, version: int = 1) -> bytes:
        if size <= CHUNK:
            return self.chunk(index, 0, size, version)
        return b"".join(SyntheticEntry(self, index, size, version=version).read(0, size))
