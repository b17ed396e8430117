"""Packing members into one tar file: ustar headers, bodies, padding, buffered writes.

A Packer appends members to an open file and remembers each member's index fields. It runs
once per stored file, so it is the tar sink's hot path. Two implementations give the same
bytes: `_ustar.c` (built by `pip install` when a C compiler is there) and PyPacker below,
used when the extension is not built. `new_packer()` picks the C one when it imports; tests
run both side by side. The C one cut the tar sink's cost over the null sink from about
14,000 to 8,800 instructions per file (benchmarks/instructions.py, results of session 10).

Headers: an ASCII name of at most 100 bytes and a size that fits 11 octal digits make a
plain ustar header; anything else gets a PAX 'x' member carrying the real path (and size)
first, built by long_header(), which both implementations call.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from typing import Protocol

from bulkfetch.sinks.base import SinkFatal
from bulkfetch.util.md5 import md5_hex

BLOCK = 512
_ZEROS = bytes(BLOCK)
_PADS = [_ZEROS[:n] for n in range(BLOCK)]  # the padding after a body of each size mod 512
END = bytes(2 * BLOCK)  # end-of-archive marker
FLUSH_AT = 1 << 20  # bytes buffered before a write(2)
MAX_OCTAL_SIZE = 8**11 - 1  # the ustar size field's limit; larger sizes go in PAX
_adler32 = zlib.adler32


class Packer(Protocol):
    """Members appended to one open file, and their index fields."""

    @property
    def offset(self) -> int:
        """Bytes of the archive so far: written plus buffered."""
        ...

    @property
    def members(self) -> list[str | int]:
        """name, data offset, size, md5 hex, name, ... of every member added."""
        ...

    def add(self, name: str, body: bytes, md5: str | None) -> None:
        """Append one member (md5 None: computed here). Raises SinkFatal when the file
        cannot be written."""
        ...

    def append(self, data: bytes) -> None:
        """Append raw bytes (the end-of-archive blocks)."""
        ...

    def flush(self) -> None:
        """Write out what is buffered."""
        ...

    def advance(self, n: int) -> None:
        """`n` bytes were written to the file by the caller right after flush() (a spooled
        body copied in by the kernel): the offset moves past them."""
        ...

    def release(self) -> None:
        """Drop the buffer and the members (the shard is closed or discarded)."""
        ...


def _ustar_parts(mtime: int) -> tuple[bytes, bytes, int]:
    """The constant bytes around the name and size fields, and their checksum share."""
    before_size = b"0000644\0" + b"0000000\0" + b"0000000\0"  # mode, uid, gid
    after_size = (
        b"%011o\0" % mtime  # mtime
        + b" " * 8  # checksum field, counted as spaces
        + b"0"  # typeflag: regular file
        + bytes(100)  # linkname
        + b"ustar\x0000"  # magic + version
        + bytes(32 + 32 + 8 + 8 + 155 + 12)  # uname, gname, devmajor, devminor, prefix, pad
    )
    return before_size, after_size, sum(before_size) + sum(after_size)


def blank_header(mtime: int) -> bytes:
    """A regular file's header with an empty name, size 0 and the checksum field as
    spaces: the template the C packer fills in."""
    before_size, after_size, _ = _ustar_parts(mtime)
    return bytes(100) + before_size + b"%011o\0" % 0 + after_size


def header(name: bytes, size: int, mtime: int, typeflag: bytes = b"0",
           name_sum: int | None = None) -> bytes:
    """A ustar header; `name_sum` stands in for sum(name) in the checksum (PyPacker builds
    one header for every name of the same length and byte sum)."""
    before_size, after_size, constant_sum = _ustar_parts(mtime)
    size_field = b"%011o\0" % size
    checksum = (constant_sum + sum(size_field) + (sum(name) if name_sum is None else name_sum)
                + typeflag[0] - 48)
    return b"".join((name.ljust(100, b"\0"), before_size, size_field, after_size[:12],
                     b"%06o\0 " % checksum, typeflag, after_size[21:]))


def pax_records(records: dict[str, str]) -> bytes:
    """PAX extended-header data: '<length> <key>=<value>\\n', the length counting itself."""
    out = []
    for key, value in records.items():
        body = f" {key}={value}\n".encode()
        length = len(body) + 1
        while len(str(length)) + len(body) != length:
            length = len(str(length)) + len(body)
        out.append(str(length).encode() + body)
    return b"".join(out)


def long_header(name: str, size: int, mtime: int) -> bytes:
    """A PAX 'x' member carrying the real path (and size when it overflows ustar), then
    the member's own ustar header with the name cut to fit."""
    records = {"path": name}
    if size > MAX_OCTAL_SIZE:
        records["size"] = str(size)
    data = pax_records(records)
    pax = header(b"././@PaxHeader", len(data), mtime, b"x")
    short = name.encode("utf-8", "replace")[:100]
    short = short.decode("utf-8", "ignore").encode("ascii", "replace")
    return b"".join((pax, data, _ZEROS[: -len(data) % BLOCK],
                     header(short, min(size, MAX_OCTAL_SIZE), mtime)))


def member_header(name: str, size: int, mtime: int) -> bytes:
    """The header(s) before a member's body: plain ustar when the name is ASCII of at most
    100 bytes and the size fits its field, else long_header() (both packers decide so)."""
    encoded = name.encode()
    if len(encoded) == len(name) <= 100 and size <= MAX_OCTAL_SIZE:
        return header(encoded, size, mtime)
    return long_header(name, size, mtime)


def _write_all(fd: int, data: bytes, where: str) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise SinkFatal(f"cannot write {where}: {exc.strerror}") from None


class PyPacker:
    """The packer in Python, for when the C extension is not built."""

    def __init__(self, fd: int, where: str, mtime: int) -> None:
        self.fd = fd
        self.where = where  # the file's path, for messages
        self.mtime = mtime
        self.tails: dict[int, tuple[bytes, bytes, int]] = {}  # see add() and _tail()
        self.buffer: list[bytes] = []
        self.offset = 0  # bytes written + buffered
        self.flushed = 0  # bytes written
        self.members: list[str | int] = []

    def _tail(self, key: int) -> tuple[bytes, bytes, int]:
        """For add()'s key (size << 24 | 1 + the name's byte sum << 7 | the name's length):
        the 412 header bytes after the name (the zeros padding it to 100 bytes, the fields
        of this size, the checksum, the rest), the body's padding, and the member's stride."""
        size, length = key >> 24, key & 127
        name_sum = (key >> 7 & 0xFFFF) - 1
        rest = header(bytes(length), size, self.mtime, name_sum=name_sum)[length:]
        pad = _PADS[-size % BLOCK]
        entry = (rest, pad, BLOCK + size + len(pad))
        if len(self.tails) < 4096:  # about 2 MB: bodies of every size must not grow it
            self.tails[key] = entry
        return entry

    def add(self, name: str, body: bytes, md5: str | None) -> None:
        size = len(body)
        encoded = name.encode()
        length = len(encoded)
        if length == len(name) <= 100 and size <= MAX_OCTAL_SIZE:
            # The common case (an ASCII name that fits), written flat: it runs once per file.
            # A header is the name plus 412 bytes that depend only on the size, the name's
            # byte sum and its length, so those bytes (with the body's padding and the
            # member's stride) come from a cache keyed by the three and are never joined
            # here. adler32's low half is 1 + the byte sum while that sum is < 65521 (100
            # bytes of at most 127): the sum in one C call.
            key = size << 24 | (_adler32(encoded) & 0xFFFF) << 7 | length
            rest, pad, stride = self.tails.get(key) or self._tail(key)
            data_at = self.offset + BLOCK
            self.offset += stride
            self.buffer += (encoded, rest, body, pad)
        else:
            head = long_header(name, size, self.mtime)
            data_at = self.offset + len(head)
            pad = _PADS[-size % BLOCK]
            self.offset = data_at + size + len(pad)
            self.buffer += (head, body, pad)
        self.members += (name, data_at, size, md5 or md5_hex(body))
        if self.offset - self.flushed >= FLUSH_AT:
            self.flush()

    def append(self, data: bytes) -> None:
        self.buffer.append(data)
        self.offset += len(data)

    def flush(self) -> None:
        data = b"".join(self.buffer)
        self.buffer.clear()
        self.flushed = self.offset
        _write_all(self.fd, data, self.where)

    def advance(self, n: int) -> None:
        if n < 0 or self.buffer:
            raise ValueError("advance(n): n must be >= 0 and the buffer flushed first")
        self.offset += n
        self.flushed = self.offset

    def release(self) -> None:
        self.buffer.clear()
        self.members.clear()


def _c_packer() -> Callable[[int, str, int], Packer] | None:
    try:
        from bulkfetch.sinks._ustar import Packer as CPacker
    except ImportError:
        return None

    def make(fd: int, where: str, mtime: int) -> Packer:
        return CPacker(fd, where, blank_header(mtime), mtime, FLUSH_AT, SinkFatal, md5_hex,
                       long_header)

    return make


_make_c_packer = _c_packer()
ACCELERATED = _make_c_packer is not None  # the C packer is built and imports
PACKER_NOTE = ("C (bulkfetch.sinks._ustar)" if ACCELERATED
               else "Python (the C extension bulkfetch.sinks._ustar is not built)")
NOT_BUILT = ("the C packer bulkfetch.sinks._ustar is not built: install a C compiler and "
             "Python's headers (Debian: gcc, python3-dev), then pip install -e . again")


def new_packer(fd: int, where: str, mtime: int, *, accelerated: bool = ACCELERATED) -> Packer:
    """A packer appending to `fd` (named `where` in messages), headers stamped `mtime`:
    the C one unless `accelerated` is False (or it is not built)."""
    if accelerated and _make_c_packer is not None:
        return _make_c_packer(fd, where, mtime)
    return PyPacker(fd, where, mtime)
