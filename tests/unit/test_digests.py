"""Which digests a server states (ETag, Content-MD5, Repr-Digest, Digest), read from the
final response only, and how a spooled body is judged against them."""

from __future__ import annotations

import base64
import hashlib
import zlib

import pytest

from bulkfetch.engine.digests import (
    final_headers,
    final_status,
    new_hasher,
    stated_digests,
    strongest,
)
from bulkfetch.engine.spooling import SpooledBody
from bulkfetch.sinks.spool import NullSpool

BODY = b"0123456789" * 1000


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def lines(*headers: str, status: str = "HTTP/1.1 200 OK") -> list[bytes]:
    return [f"{status}\r\n".encode(), *(f"{h}\r\n".encode() for h in headers), b"\r\n"]


def test_only_the_final_response_counts_after_a_redirect() -> None:
    raw = [*lines("Location: /b", "ETag: \"" + "a" * 32 + '"', status="HTTP/1.1 302 Found"),
           *lines("Content-Length: 5")]
    assert final_status(raw) == 200
    assert final_headers(raw) == {"content-length": "5"}
    assert stated_digests(final_headers(raw)) == {}


def test_final_status_of_nothing_and_of_a_garbled_line() -> None:
    assert final_status([]) == 0
    assert final_status([b"HTTP/1.1 abc\r\n"]) == 0
    assert final_status(lines(status="HTTP/2 404")) == 404


def test_repr_digest_first_then_digest_then_content_md5_then_etag() -> None:
    sha = hashlib.sha256(BODY).digest()
    md5 = hashlib.md5(BODY).digest()
    headers = final_headers(lines(f"Repr-Digest: sha-256=:{b64(sha)}:, md5=:{b64(md5)}:",
                                  'ETag: "' + "0" * 32 + '"'))
    assert stated_digests(headers) == {"sha256": sha, "md5": md5}
    legacy = final_headers(lines(f"Digest: SHA-256={b64(sha)}", f"Content-MD5: {b64(md5)}"))
    assert stated_digests(legacy) == {"sha256": sha, "md5": md5}
    etag = final_headers(lines(f'ETag: "{md5.hex()}"'))
    assert stated_digests(etag) == {"md5": md5}


@pytest.mark.parametrize("header", [
    'ETag: W/"' + "a" * 32 + '"',  # weak
    'ETag: "5f3e-1a2b"',  # nginx's mtime-size
    "Repr-Digest: sha-256=:not base64!:",
    "Repr-Digest: crc32=:AAAAAA==:",  # not one we check
    "Content-MD5: %%%",
])
def test_what_is_not_a_usable_digest_is_ignored(header: str) -> None:
    assert stated_digests(final_headers(lines(header))) == {}


def test_repeated_repr_digest_headers_are_one_list() -> None:
    sha256, sha512 = hashlib.sha256(BODY).digest(), hashlib.sha512(BODY).digest()
    headers = final_headers(lines(f"Repr-Digest: sha-256=:{b64(sha256)}:",
                                  f"Repr-Digest: sha-512=:{b64(sha512)}:"))
    found = stated_digests(headers)
    assert found == {"sha256": sha256, "sha512": sha512}
    assert strongest(found) == ("sha512", sha512)
    assert strongest({"md5": b"x"}) is None


def spooled(raw: list[bytes]) -> SpooledBody:
    return SpooledBody(transfer=None, spool=NullSpool(), lines=raw)


def feed(body: SpooledBody, data: bytes) -> list[int | None]:
    return [body.write(data[at : at + 4096]) for at in range(0, len(data), 4096)]


def test_a_body_matching_its_repr_digest_passes_and_a_wrong_one_fails() -> None:
    right = spooled(lines(f"Repr-Digest: sha-256=:{b64(hashlib.sha256(BODY).digest())}:"))
    assert set(feed(right, BODY)) == {None}
    assert right.size == len(BODY)
    assert right.mismatch(len(BODY), verify=True) is None
    wrong = spooled(lines(f"Repr-Digest: sha-256=:{b64(hashlib.sha256(b'x').digest())}:"))
    feed(wrong, BODY)
    assert "SHA256" in (wrong.mismatch(len(BODY), verify=True) or "")
    assert wrong.mismatch(len(BODY), verify=False) is None  # --no-verify


def test_an_md5_etag_that_does_not_match_fails_and_a_short_body_fails() -> None:
    body = spooled(lines('ETag: "' + "f" * 32 + '"'))
    feed(body, BODY)
    assert "MD5" in (body.mismatch(len(BODY), verify=True) or "")
    short = spooled(lines())
    feed(short, BODY[:-1])
    assert short.mismatch(len(BODY), verify=True) == (
        f"body of {len(BODY) - 1} bytes, Content-Length {len(BODY)}")
    assert short.md5.hexdigest() == hashlib.md5(BODY[:-1]).hexdigest()


def test_a_status_other_than_200_stops_the_body_before_it_is_written() -> None:
    class Counting(NullSpool):
        __slots__ = ("chunks",)

        def __init__(self) -> None:
            self.chunks = 0

        def write(self, data: bytes) -> None:
            self.chunks += 1

    spool = Counting()
    body = SpooledBody(transfer=None, spool=spool,
                       lines=lines(status="HTTP/1.1 503 Service Unavailable"))
    assert body.write(b"error page") == 0
    assert (body.status, spool.chunks, body.size) == (503, 0, 0)


MULTIPART_ETAG = 'ETag: "' + "9" * 32 + '-3"'  # an object uploaded in 3 parts: no MD5


def _crc64nvme(data: bytes) -> bytes:
    checksums = pytest.importorskip("awscrt.checksums")
    return checksums.crc64nvme(data).to_bytes(8, "big")


@pytest.mark.parametrize("algorithm, digest", [
    ("crc32", lambda d: zlib.crc32(d).to_bytes(4, "big")),
    ("sha256", lambda d: hashlib.sha256(d).digest()),
    ("crc64nvme", _crc64nvme),
])
def test_an_s3_full_object_checksum_checks_a_multipart_object(algorithm, digest) -> None:
    headers = [MULTIPART_ETAG, f"x-amz-checksum-{algorithm}: {b64(digest(BODY))}",
               "x-amz-checksum-type: FULL_OBJECT"]
    assert stated_digests(final_headers(lines(*headers))) == {algorithm: digest(BODY)}
    right = spooled(lines(*headers))
    feed(right, BODY)
    assert right.mismatch(len(BODY), verify=True) is None
    corrupt = spooled(lines(*headers))
    feed(corrupt, BODY[:-1] + b"!")
    assert algorithm.upper() in (corrupt.mismatch(len(BODY), verify=True) or "")


def test_a_composite_s3_checksum_is_not_taken_for_the_bodys() -> None:
    # a checksum of the parts' checksums: the body alone cannot be checked against it
    for headers in ([f"x-amz-checksum-crc32: {b64(b'abcd')}-3",
                     "x-amz-checksum-type: COMPOSITE"],
                    [f"x-amz-checksum-crc32: {b64(b'abcd')}", "x-amz-checksum-type: COMPOSITE"],
                    [f"x-amz-checksum-sha256: {b64(b'x' * 32)}-2"]):
        assert stated_digests(final_headers(lines(MULTIPART_ETAG, *headers))) == {}


def test_new_hasher_has_hashlibs_face() -> None:
    crc = new_hasher("crc32")
    crc.update(BODY[:10])
    crc.update(BODY[10:])
    assert crc.name == "crc32" and crc.digest() == zlib.crc32(BODY).to_bytes(4, "big")
    assert new_hasher("sha256").name == "sha256"


def test_a_pinned_digest_replaces_what_the_server_states() -> None:
    from bulkfetch.sources.abilities import Pinned

    pinned = Pinned(len(BODY), "sha256", hashlib.sha256(BODY).digest())
    wrong_md5 = b64(hashlib.md5(b"other").digest())
    body = SpooledBody(("state", "blob", "url", 1), NullSpool(),
                       lines(f"Content-Length: {len(BODY)}", f"Content-MD5: {wrong_md5}"),
                       pinned=pinned)
    body.write(BODY)
    assert body.stated == {"sha256": pinned.digest}  # the server's MD5 is not the authority
    assert body.mismatch(len(BODY), True) is None
    assert pinned.mismatch(BODY) is None


def test_a_body_unlike_its_pin_fails_and_an_overlong_one_stops_at_the_pinned_size() -> None:
    from bulkfetch.sources.abilities import Pinned

    pinned = Pinned(len(BODY), "sha256", hashlib.sha256(BODY).digest())
    altered = BODY[:-1] + b"!"
    body = SpooledBody(("s", "blob", "u", 1), NullSpool(), lines(), pinned=pinned)
    body.write(altered)
    assert "does not match the digest the source gives" in str(body.mismatch(-1, True))
    assert "does not match" in str(pinned.mismatch(altered))
    assert "bytes, the source gives" in str(pinned.mismatch(BODY[:10]))
    short = SpooledBody(("s", "blob", "u", 1), NullSpool(), lines(), pinned=pinned)
    short.write(BODY[:10])
    assert short.mismatch(-1, True) == f"body of 10 bytes, the source gives {len(BODY)}"
    long = SpooledBody(("s", "blob", "u", 1), NullSpool(), lines(), pinned=pinned)
    assert long.write(BODY) is None
    assert long.write(b"x") == 0  # one byte past the pin stops the transfer
    assert "longer than" in str(long.error)


def test_a_body_held_in_memory_is_checked_by_what_else_its_server_states() -> None:
    from bulkfetch.engine.digests import (
        BY_DIGEST,
        BY_MD5,
        BY_SIZE,
        held_body_mismatch,
        states_digest,
    )

    def states(raw: list[bytes]) -> bool:
        return states_digest(b"".join(raw).lower())

    md5 = hashlib.md5(BODY).hexdigest()
    crc = b64(zlib.crc32(BODY).to_bytes(4, "big"))
    multipart = lines('ETag: "0123456789abcdef0123456789abcdef-3"',
                      f"x-amz-checksum-crc32: {crc}", "x-amz-checksum-type: FULL_OBJECT")
    assert states(multipart) and held_body_mismatch(multipart, BODY, md5) == (None, BY_DIGEST)
    reason, way = held_body_mismatch(multipart, BODY[:-1] + b"!", md5)
    assert reason == "CRC32 of the body does not match the server's checksum" and \
        way == BY_DIGEST
    sha = lines(f"Repr-Digest: sha-256=:{b64(hashlib.sha256(BODY).digest())}:")
    assert states(sha) and held_body_mismatch(sha, BODY, md5) == (None, BY_DIGEST)
    assert "SHA256 of the body" in str(held_body_mismatch(sha, b"other", md5)[0])
    by_md5 = lines(f"Digest: md5={b64(hashlib.md5(BODY).digest())}")
    assert held_body_mismatch(by_md5, BODY, md5) == (None, BY_MD5)
    assert "MD5 of the body" in str(held_body_mismatch(by_md5, BODY, "0" * 32)[0])
    composite = lines(f"x-amz-checksum-crc32: {crc}-3", "x-amz-checksum-type: COMPOSITE")
    assert held_body_mismatch(composite, b"anything", md5) == (None, BY_SIZE)
    assert not states(lines('ETag: "1234-5678"', "Content-Length: 10"))  # nginx: size only
