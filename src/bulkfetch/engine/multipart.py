"""An S3 object uploaded in parts, checked whole.

Its ETag is no MD5 of the body but the MD5 of its N parts' MD5s, "<hex>-N", and a checksum
it was uploaded with may be COMPOSITE the same way, "<base64>-N" (x-amz-checksum-type). The
body can be checked against either once the parts' boundaries are known. The response does
not say them; `HEAD key?partNumber=1` does (S3, SeaweedFS and moto answer it): part 1's
Content-Length and x-amz-mp-parts-count. Every uploader in common use (the AWS CLI and
SDKs, rclone, s5cmd, mc) cuts an upload into parts of one size and a shorter last one; a
part size that does not fit the object's size and count is no layout (checked by size, as
before). The digest's name carries the part size ("md5-parts/8388608"), so a resume record
(engine/resume.py) that keeps the stated digests keeps the layout with them.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
from dataclasses import dataclass
from typing import Any

_MULTIPART_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})-([0-9]{1,5})"?$')
_COMPOSITE = ("sha256", "sha1", "crc32c", "crc32")  # S3's checksums that can be COMPOSITE
PARTS = "-parts/"  # in a digest's name: "<algorithm>-parts/<part size>"
PARTS_MAX = 10_000  # S3's limit on the parts of an upload


@dataclass(frozen=True, slots=True)
class PartClaims:
    """What a response states of an object uploaded in `count` parts: algorithm (a hashlib
    name, or crc32/crc32c) -> the raw digest of the concatenated parts' digests."""

    count: int
    digests: dict[str, bytes]

    def named(self, part_size: int) -> dict[str, bytes]:
        """The claims as stated digests for parts of `part_size` bytes (new_hasher reads
        the names)."""
        return {f"{algorithm}{PARTS}{part_size}": raw for algorithm, raw in self.digests.items()}


def fits(part_size: int, total: int, count: int) -> bool:
    """Whether parts of `part_size` cut `total` bytes into `count` parts."""
    return part_size > 0 and (count - 1) * part_size < total <= count * part_size


def claims(headers: dict[str, str]) -> PartClaims | None:
    """The part claims of a response's final headers (digests.final_headers), or None when
    it states no upload in two or more parts (a weak ETag, W/"...", never matches)."""
    found = _MULTIPART_ETAG.match(headers.get("etag", ""))
    if found is None:
        return None
    count = int(found[2])
    if not 2 <= count <= PARTS_MAX:
        return None
    digests = {"md5": bytes.fromhex(found[1])}
    composite = headers.get("x-amz-checksum-type", "").upper() == "COMPOSITE"
    for algorithm in _COMPOSITE:
        value, dash, parts = headers.get(f"x-amz-checksum-{algorithm}", "").partition("-")
        # "<base64>-N"; moto's HEAD leaves the "-N" off, its type says COMPOSITE
        if value and (parts == str(count) if dash else composite):
            with contextlib.suppress(binascii.Error, ValueError):
                digests[algorithm] = base64.b64decode(value, validate=True)
    return PartClaims(count, digests)


def part_size(headers: dict[str, str], total: int, count: int) -> int | None:
    """The size of every part but the last, from the final headers of `HEAD ?partNumber=1`
    for an object of `total` bytes in `count` parts; None when they do not give one that
    cuts `total` into `count` parts."""
    length, parts = headers.get("content-length", ""), headers.get("x-amz-mp-parts-count", "")
    if not (length.isdigit() and parts.isdigit()) or int(parts) != count:
        return None
    size = int(length)
    return size if fits(size, total, count) else None


def parse_name(name: str) -> tuple[str, int] | None:
    """(algorithm, part size) of a digest name "<algorithm>-parts/<size>", else None."""
    algorithm, marker, size = name.partition(PARTS)
    if not marker or not size.isdigit() or int(size) <= 0:
        return None
    return algorithm, int(size)


class PartsHasher:
    """A digest over parts of `size` bytes: each part hashed by `new()`, and the parts' raw
    digests hashed again at the end, as S3 makes a multipart ETag and a COMPOSITE checksum.
    Fed the body in order, in chunks of any size."""

    def __init__(self, name: str, size: int, new: Any) -> None:
        self.name, self._size, self._new = name, size, new
        self._part = new()
        self._left = size  # bytes until the current part ends
        self._digests: list[bytes] = []

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while len(view) >= self._left:
            self._part.update(view[: self._left])
            view = view[self._left :]
            self._digests.append(self._part.digest())
            self._part, self._left = self._new(), self._size
        if view:
            self._part.update(view)
            self._left -= len(view)

    def digest(self) -> bytes:
        digests = list(self._digests)
        if self._left != self._size or not digests:  # the last part, shorter
            digests.append(self._part.digest())
        outer = self._new()
        outer.update(b"".join(digests))
        return outer.digest()

    @property
    def label(self) -> tuple[str, str]:
        """For messages: what this checks, and against what."""
        algorithm = self.name.partition(PARTS)[0]
        if algorithm == "md5":
            return "MD5 of each part", "the server's multipart ETag"
        return f"{algorithm.upper()} of each part", "the server's composite checksum"


@dataclass(slots=True, eq=False)
class LayoutProbe:
    """The `HEAD ?partNumber=1` asked for a file before its body, and what to go on with:
    the plan of its first response (parts.SplitPlan, or None) and the claims in it."""

    plan: Any
    claims: PartClaims
    total: int
    lines: list[bytes] | None = None  # the handle's raw header lines
    started: bool = False  # (read by BigFiles._release, as of a body)
    status: int = 0
    retry_after: float | None = None
    announced: float = -1
