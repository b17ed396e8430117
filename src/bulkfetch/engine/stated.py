"""What a server's answer and a listing state of a body, and whether the body is it: the MD5
of a strong ETag or Content-MD5, and a listing's size and digest (S3's Size and ETag, a JSON
listing's md5/sha256), for the fetcher's checks."""

from __future__ import annotations

import base64
import binascii
import hashlib

from bulkfetch.net.curl import header_values

_HEX = frozenset("0123456789abcdef")
_HEX_BYTES = frozenset(b"0123456789abcdef")
SHA256 = "sha256:"  # a listed digest that is a SHA-256, not an MD5 (Page.md5s)


def unlike_listing(listed: tuple[int, str], body: bytes, digest: str | None) -> str | None:
    """Why a body that is whole by its own answer (Content-Length, ETag) is not the object
    the listing stated (`listed`: size, hex MD5, "sha256:<hex>" (a JSON listing that states
    only that) or ""; `digest`: the body's MD5, None when not verifying): it changed since it
    was listed. None when it is that object."""
    size, md5 = listed
    if size >= 0 and len(body) != size:
        return f"changed since it was listed: body of {len(body):,} bytes, the listing " \
            f"gives {size:,}"
    if md5 and digest is not None and digest != md5:
        if md5.startswith(SHA256):
            if hashlib.sha256(body).hexdigest() == md5[len(SHA256):]:
                return None
            return "changed since it was listed: its SHA-256 is not the one the listing gives"
        return "changed since it was listed: its MD5 is not the one the listing gives"
    return None


def expected_md5(etag: str | None, content_md5: str | None) -> str | None:
    """The body's MD5 as the server states it: a strong ETag of 32 hex digits (S3 and the
    seed API), or Content-MD5 (base64). None when the server states none."""
    if content_md5:
        try:
            return base64.b64decode(content_md5, validate=True).hex()
        except (binascii.Error, ValueError):
            return None
    if etag and not etag.startswith("W/"):
        tag = etag.strip('"').lower()
        if len(tag) == 32 and _HEX.issuperset(tag):
            return tag
    return None


def stated_md5(lines: list[bytes], lowered: bytes | None = None) -> str | None:
    """expected_md5() of the raw header lines (the last ETag or Content-MD5 wins).

    Every file from a server whose ETag is not an MD5 (nginx's "mtime-size", a multipart S3
    ETag) comes here, so the usual case, an ETag and no Content-MD5, is read straight from
    the lowered block: 11,246 against 17,252 instructions through header_values() for
    nginx's ten header lines (callgrind, marginal per call). A weak tag, W/"...", keeps its
    "w/" through the strip and so is never taken for 32 digits. `lowered`: the lines
    joined and lower-cased, when the caller has them."""
    if lowered is None:
        lowered = b"".join(lines).lower()
    if b"\ncontent-md5:" in lowered:
        return expected_md5(*header_values(lines, b"etag", b"content-md5"))
    at = lowered.rfind(b"\netag:")
    if at < 0:
        return None
    end = lowered.find(b"\n", at + 6)
    tag = lowered[at + 6 : end if end >= 0 else None].strip().strip(b'"')
    if len(tag) == 32 and _HEX_BYTES.issuperset(tag):
        return tag.decode("ascii")
    return None
