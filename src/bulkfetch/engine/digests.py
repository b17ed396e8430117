"""The digests a server states for a body: an MD5 ETag or Content-MD5, and RFC 9530's
Repr-Digest (or the older RFC 3230 Digest) with sha-256, sha-512 or md5.

Only the headers of the final response count: with redirects followed, the raw header
lines hold every response's headers one after the other.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

# Algorithms we check, by their names in Repr-Digest / Digest, as hashlib names.
_ALGORITHMS = {"sha-256": "sha256", "sha-512": "sha512", "md5": "md5"}
_STRENGTH = {"md5": 0, "sha256": 1, "sha512": 2}
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


def mismatch(stated: dict[str, bytes], md5: Any, other: Any, what: str) -> str | None:
    """Why `what` (hashed into the hashlib objects `md5` and `other`, the latter for
    strongest(stated) or None) is not what the server stated, or None."""
    expected = stated.get("md5")
    if expected is not None and expected != md5.digest():
        return f"MD5 of {what} does not match the server's ETag/Content-MD5/Repr-Digest"
    if other is not None and other.digest() != stated.get(other.name):
        return f"{other.name.upper()} of {what} does not match the server's Repr-Digest"
    return None


def strongest(digests: dict[str, bytes]) -> tuple[str, bytes] | None:
    """The strongest stated digest other than md5 (md5 is always computed anyway)."""
    others = [name for name in digests if name != "md5"]
    if not others:
        return None
    name = max(others, key=_STRENGTH.__getitem__)
    return name, digests[name]
