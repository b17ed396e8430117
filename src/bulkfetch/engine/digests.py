"""The digests a server states for a body: an MD5 ETag or Content-MD5, RFC 9530's
Repr-Digest (or the older RFC 3230 Digest) with sha-256, sha-512 or md5, and S3's stored
checksum of the whole object (x-amz-checksum-*, asked for with x-amz-checksum-mode), which
is how an object uploaded in parts, whose ETag is no MD5, is checked.

Only the headers of the final response count: with redirects followed, the raw header
lines hold every response's headers one after the other.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Any

from bulkfetch.engine.multipart import PartsHasher, parse_name

# Algorithms we check, by their names in Repr-Digest / Digest, as hashlib names.
_ALGORITHMS = {"sha-256": "sha256", "sha-512": "sha512", "md5": "md5"}
_STRENGTH = {"md5": 0, "crc32": 1, "crc32c": 2, "crc64nvme": 3, "sha1": 4, "sha256": 5,
             "sha512": 6}
# S3's checksum headers; a value ending in "-N" is a checksum of the N parts' checksums
# (COMPOSITE), which the body alone cannot be checked against.
_S3_CHECKSUMS = ("crc64nvme", "crc32c", "crc32", "sha256", "sha1")
_REPR_MEMBER = re.compile(r"\s*([A-Za-z0-9_.*-]+)\s*=\s*:([A-Za-z0-9+/=]*):\s*(?:;[^,]*)?")
_LEGACY_MEMBER = re.compile(r"\s*([A-Za-z0-9_.*-]+)\s*=\s*([A-Za-z0-9+/=]+)\s*")


def final_headers(lines: list[bytes]) -> dict[str, str]:
    """The final response's headers (lower-case names; the last of a repeated one wins,
    except digests, whose values are joined as a list)."""
    start = 0
    for at, line in enumerate(lines):
        if line.startswith(b"HTTP/"):
            start = at
    headers: dict[str, str] = {}
    for line in lines[start + 1 :]:
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon:
            continue
        key, value = name.strip().lower(), value.strip()
        if key in ("repr-digest", "digest") and key in headers:
            headers[key] += ", " + value
        else:
            headers[key] = value
    return headers


def final_status(lines: list[bytes]) -> int:
    """The final response's status code (0 when no status line has come)."""
    for line in reversed(lines):
        if line.startswith(b"HTTP/"):
            fields = line.split(None, 2)
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1])
            return 0
    return 0


def _b64(value: str) -> bytes | None:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def stated_digests(headers: dict[str, str]) -> dict[str, bytes]:
    """hashlib name -> the raw digest the headers state for the whole body: Repr-Digest
    first, then Digest, then Content-MD5 and a strong 32-hex-digit ETag for md5."""
    found: dict[str, bytes] = {}
    for member in _REPR_MEMBER.finditer(headers.get("repr-digest", "")):
        algorithm, raw = _ALGORITHMS.get(member[1].lower()), _b64(member[2])
        if algorithm and raw is not None:
            found.setdefault(algorithm, raw)
    for member in _LEGACY_MEMBER.finditer(headers.get("digest", "")):
        algorithm, raw = _ALGORITHMS.get(member[1].lower()), _b64(member[2])
        if algorithm and raw is not None:
            found.setdefault(algorithm, raw)
    if headers.get("x-amz-checksum-type", "FULL_OBJECT").upper() == "FULL_OBJECT":
        for algorithm in _S3_CHECKSUMS:
            value = headers.get(f"x-amz-checksum-{algorithm}", "")
            raw = _b64(value) if value and "-" not in value else None
            if raw is not None and new_hasher(algorithm) is not None:
                found.setdefault(algorithm, raw)
    if "md5" not in found:
        content_md5 = headers.get("content-md5")
        raw = _b64(content_md5) if content_md5 else None
        if raw is None:
            tag = headers.get("etag", "")
            if not tag.startswith("W/"):
                tag = tag.strip('"').lower()
                if len(tag) == 32:
                    try:
                        raw = bytes.fromhex(tag)
                    except ValueError:
                        raw = None
        if raw is not None:
            found["md5"] = raw
    return {name: raw for name, raw in found.items() if raw}


# How a stored body was checked (Fetcher.checked): an MD5 the server stated, another digest
# it stated (S3's x-amz-checksum-*, Repr-Digest), or its length alone.
BY_MD5, BY_DIGEST, BY_SIZE = 0, 1, 2


def checked_way(stated: dict[str, bytes]) -> int:
    """How a big body whose server stated `stated` (digests.stated_digests) was checked (a
    multipart ETag, "md5-parts/...", counts as by MD5)."""
    if any(not name.startswith("md5") for name in stated):
        return BY_DIGEST
    return BY_MD5 if stated else BY_SIZE


def mismatch(stated: dict[str, bytes], md5: Any, other: Any, what: str,
             vouched_by: str = "") -> str | None:
    """Why `what` (hashed into the hashlib objects `md5` and `other`, the latter for
    strongest(stated) or None) is not what the server stated (or, given `vouched_by`, what
    that part of the source vouched for: a Pinned digest), or None."""
    expected = stated.get("md5")
    if expected is not None and expected != md5.digest():
        whose = f"the digest {vouched_by} gives" if vouched_by else \
            "the server's ETag/Content-MD5/Repr-Digest"
        return f"MD5 of {what} does not match {whose}"
    if other is not None and other.digest() != stated.get(other.name):
        if isinstance(other, PartsHasher):
            which, whose = other.label
            return f"{which} of {what} does not match {whose}"
        whose = f"the digest {vouched_by} gives" if vouched_by else "the server's " + (
            "checksum" if other.name.startswith("crc") else "Repr-Digest")
        return f"{other.name.upper()} of {what} does not match {whose}"
    return None


def states_digest(lowered: bytes) -> bool:
    """Whether the raw header lines (joined, lower-cased) may state a digest other than an
    ETag or Content-MD5 (Repr-Digest, Digest, x-amz-checksum-*): a look before
    held_body_mismatch()'s parse."""
    return b"digest:" in lowered or b"\nx-amz-checksum-" in lowered


def held_body_mismatch(lines: list[bytes], body: bytes, md5_hex: str) -> tuple[str | None, int]:
    """For a body held in memory whose server stated no MD5 ETag or Content-MD5: why it is
    not what the final response's other digests state (an S3 object uploaded in parts: its
    x-amz-checksum-*; Repr-Digest), or None; and how it was checked (BY_...)."""
    stated = stated_digests(final_headers(lines))
    expected = stated.pop("md5", None)
    if expected is not None and expected.hex() != md5_hex:
        return "MD5 of the body does not match the server's Repr-Digest/Digest", BY_MD5
    other = strongest(stated)
    hasher = new_hasher(other[0]) if other is not None else None
    if hasher is not None:
        hasher.update(body)
        return mismatch(stated, None, hasher, "the body"), BY_DIGEST
    return None, BY_MD5 if expected is not None else BY_SIZE


class NoMd5:
    """In place of an MD5 nobody will check: a pinned body's (its pinned digest is the
    check; MD5 at ~600 MB/s would cost more CPU than the SHA-256 it stands beside). Its
    empty hexdigest tells the sink to record no md5sum line."""

    name = "md5"

    def update(self, data: bytes) -> None:
        pass

    def digest(self) -> bytes:
        return b""

    def hexdigest(self) -> str:
        return ""


def md5_hasher(verify: bool, keep_md5: bool, pinned_other: bool) -> Any:
    """The MD5 a big body takes as it streams: a real one when it is checked (`verify`,
    and no pinned SHA is the check instead: `pinned_other`) or when the sink records every
    body's MD5 (`keep_md5`, Sink.needs_md5), else a NoMd5."""
    if keep_md5 or (verify and not pinned_other):
        return hashlib.md5(usedforsecurity=False)
    return NoMd5()


class _Crc:
    """A CRC with hashlib's face (update, digest, name): zlib's CRC32, or awscrt's CRC32C
    and CRC64NVME (C code; the `s3` extra)."""

    def __init__(self, name: str, function: Any, size: int) -> None:
        self.name, self._function, self._size, self._value = name, function, size, 0

    def update(self, data: bytes) -> None:
        self._value = self._function(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._size, "big")


def new_hasher(name: str) -> Any:
    """A fresh hasher for a digest name of stated_digests() or of an upload's parts
    (multipart.PartClaims.named), or None when this machine cannot compute it (awscrt
    missing for crc32c and crc64nvme)."""
    parts = parse_name(name)
    if parts is not None:
        algorithm, size = parts
        if new_hasher(algorithm) is None:
            return None
        return PartsHasher(name, size, lambda: new_hasher(algorithm))
    if name == "crc32":
        import zlib

        return _Crc(name, zlib.crc32, 4)
    if name in ("crc32c", "crc64nvme"):
        try:
            from awscrt import checksums
        except ImportError:
            return None
        return _Crc(name, getattr(checksums, name), 4 if name == "crc32c" else 8)
    import hashlib

    return hashlib.new(name)


def _strength(name: str) -> int:
    """A whole body's digest over one of its parts' (which costs a hash per part), and
    among those the stronger algorithm."""
    parts = parse_name(name)
    if parts is None:
        return 2 * _STRENGTH[name] + 1
    return 2 * _STRENGTH[parts[0]]


def strongest(digests: dict[str, bytes]) -> tuple[str, bytes] | None:
    """The strongest stated digest other than md5 (md5 is always computed anyway)."""
    others = [name for name in digests if name != "md5"]
    if not others:
        return None
    name = max(others, key=_strength)
    return name, digests[name]
